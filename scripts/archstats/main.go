package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	dir := flag.String("dir", "pkg/train", "package folder")
	typ := flag.String("type", "Trainer", "struct whose fields and methods are counted")
	top := flag.Int("top", 10, "longest functions to list")
	whole := flag.Bool("house", false, "the whole tree's figures (issue #49's targets) instead of one package's")
	flag.Parse()
	if *whole {
		if err := house(".", "github.com/drmas/drmas"); err != nil {
			fmt.Fprintln(os.Stderr, "archstats:", err)
			os.Exit(1)
		}
		if err := run("pkg/train", "Trainer", 0); err != nil {
			fmt.Fprintln(os.Stderr, "archstats:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*dir, *typ, *top); err != nil {
		fmt.Fprintln(os.Stderr, "archstats:", err)
		os.Exit(1)
	}
}

type fn struct {
	name, file string
	lines      int
}

func run(dir, typ string, top int) error {
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	files := map[string]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		files[filepath.Base(p)] = f
	}
	if len(files) == 0 {
		return fmt.Errorf("%s: no Go files", dir)
	}
	declared := map[string]string{} // top-level name -> file
	methods := map[string]string{}  // method name -> file ("" when declared in several files: not counted)
	var funcs []fn
	fields, nMethods := 0, 0
	methodFiles := map[string]int{}
	for name, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				lines := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
				label := d.Name.Name
				if d.Recv != nil {
					recv := recvName(d.Recv.List[0].Type)
					label = recv + "." + label
					if prev, ok := methods[d.Name.Name]; ok && prev != name {
						methods[d.Name.Name] = ""
					} else {
						methods[d.Name.Name] = name
					}
					if recv == typ {
						nMethods++
						methodFiles[name]++
					}
				} else {
					declared[d.Name.Name] = name
				}
				funcs = append(funcs, fn{label, name, lines})
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						declared[s.Name.Name] = name
						if st, ok := s.Type.(*ast.StructType); ok && s.Name.Name == typ {
							for _, fl := range st.Fields.List {
								if len(fl.Names) == 0 {
									fields++
								}
								fields += len(fl.Names)
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							declared[n.Name] = name
						}
					}
				}
			}
		}
	}
	refs := map[[2]string]int{}
	for name, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if decl := methods[n.Sel.Name]; decl != "" && decl != name {
					refs[[2]string{name, decl}]++
				}
			case *ast.Ident:
				if decl, ok := declared[n.Name]; ok && decl != name && n.Obj == nil {
					refs[[2]string{name, decl}]++
				}
			}
			return true
		})
	}
	fmt.Printf("%s: %d non-test files\n", dir, len(files))
	fmt.Printf("%s: %d fields, %d methods in %d files %v\n", typ, fields, nMethods, len(methodFiles), sortedKeys(methodFiles))
	sort.Slice(funcs, func(i, j int) bool { return funcs[i].lines > funcs[j].lines })
	fmt.Printf("longest functions:\n")
	for i := 0; i < top && i < len(funcs); i++ {
		fmt.Printf("  %4d  %s (%s)\n", funcs[i].lines, funcs[i].name, funcs[i].file)
	}
	pairs, mutual, total := 0, 0, 0
	var mutualList []string
	for k, v := range refs {
		pairs++
		total += v
		if k[0] < k[1] {
			if w, ok := refs[[2]string{k[1], k[0]}]; ok {
				mutual++
				mutualList = append(mutualList, fmt.Sprintf("%s<->%s (%d/%d)", k[0], k[1], v, w))
			}
		}
	}
	sort.Strings(mutualList)
	fmt.Printf("file references: %d uses across %d file pairs; %d back-reference pairs (files using each other)\n", total, pairs, mutual)
	for _, m := range mutualList {
		fmt.Printf("  %s\n", m)
	}
	return nil
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return recvName(t.X)
	}
	return "?"
}

func sortedKeys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
