package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// house prints the whole tree's shape figures that issue #49 sets targets for: functions over 80
// lines and files over 500 lines in pkg/ and cmd/ (non-test), functions taking *config.Config,
// pkg/config's drmas imports, the imports that must not exist, and pkg/train's size.
func house(root, module string) error {
	fset := token.NewFileSet()
	type fnInfo struct {
		name  string
		lines int
	}
	var long []fnInfo
	var bigFiles []string
	var cfgFuncs []string
	imports := map[string]map[string]bool{} // package dir -> drmas packages it imports
	trainLines := 0
	for _, top := range []string{"pkg", "cmd"} {
		err := filepath.Walk(filepath.Join(root, top), func(p string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			if info.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			rel, _ := filepath.Rel(root, p)
			if strings.Contains(rel, "testdata") {
				return nil
			}
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			f, err := parser.ParseFile(fset, p, src, 0)
			if err != nil {
				return err
			}
			lines := strings.Count(string(src), "\n")
			dir := filepath.Dir(rel)
			if lines > 500 {
				bigFiles = append(bigFiles, fmt.Sprintf("%5d  %s", lines, rel))
			}
			if dir == filepath.Join("pkg", "train") {
				trainLines += lines
			}
			if imports[dir] == nil {
				imports[dir] = map[string]bool{}
			}
			cfgAlias := ""
			for _, im := range f.Imports {
				path, _ := strconv.Unquote(im.Path.Value)
				if strings.HasPrefix(path, module+"/") {
					imports[dir][strings.TrimPrefix(path, module+"/")] = true
				}
				if path == module+"/pkg/config" {
					cfgAlias = "config"
					if im.Name != nil {
						cfgAlias = im.Name.Name
					}
				}
			}
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok {
					continue
				}
				n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
				label := fd.Name.Name
				if fd.Recv != nil {
					label = recvName(fd.Recv.List[0].Type) + "." + label
				}
				label = rel + ":" + label
				if n > 80 {
					long = append(long, fnInfo{label, n})
				}
				if takesConfig(fd, cfgAlias, dir == filepath.Join("pkg", "config")) {
					cfgFuncs = append(cfgFuncs, label)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	sort.Slice(long, func(i, j int) bool { return long[i].lines > long[j].lines })
	fmt.Printf("functions over 80 lines (pkg/, cmd/, non-test): %d (target <= 8)\n", len(long))
	for _, f := range long {
		fmt.Printf("  %4d  %s\n", f.lines, f.name)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(bigFiles)))
	fmt.Printf("production files over 500 lines: %d (target <= 4)\n", len(bigFiles))
	for _, f := range bigFiles {
		fmt.Printf("  %s\n", f)
	}
	sort.Strings(cfgFuncs)
	fmt.Printf("functions taking *config.Config: %d (target <= 15)\n", len(cfgFuncs))
	for _, f := range cfgFuncs {
		fmt.Printf("  %s\n", f)
	}
	var cfgImports []string
	for p := range imports[filepath.Join("pkg", "config")] {
		cfgImports = append(cfgImports, p)
	}
	sort.Strings(cfgImports)
	fmt.Printf("pkg/config imports %d drmas packages (target <= 8): %s\n", len(cfgImports), strings.Join(cfgImports, " "))
	bad := 0
	for _, rule := range [][2]string{{"pkg/dist", "pkg/train"}, {"pkg/arch", "pkg/policy"}, {"pkg/rundir", "pkg/policy"}} {
		for dir, ims := range imports {
			if dir != rule[0] && !strings.HasPrefix(dir, rule[0]+"/") {
				continue
			}
			for im := range ims {
				if im == rule[1] || strings.HasPrefix(im, rule[1]+"/") {
					fmt.Printf("  forbidden import: %s -> %s\n", dir, im)
					bad++
				}
			}
		}
	}
	fmt.Printf("forbidden imports (dist->train, arch->policy, rundir->policy): %d (target 0)\n", bad)
	fmt.Printf("pkg/train production lines: %d (target <= 5500)\n", trainLines)
	return nil
}

// takesConfig says whether a function has a parameter of type *config.Config (inside pkg/config:
// *Config; methods on Config itself are not counted).
func takesConfig(fd *ast.FuncDecl, alias string, inConfig bool) bool {
	for _, fl := range fd.Type.Params.List {
		star, ok := fl.Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		switch x := star.X.(type) {
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && alias != "" && id.Name == alias && x.Sel.Name == "Config" {
				return true
			}
		case *ast.Ident:
			if inConfig && x.Name == "Config" {
				return true
			}
		}
	}
	return false
}
