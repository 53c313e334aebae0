package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

var errLine = regexp.MustCompile(`(?m)^[^:\n]*?(torch_api(?:_generated\.cpp\.h|\.cpp)):(\d+):\d+: error:`)

// stubMissingOps compiles gotch's C++ wrappers against this libtorch and replaces each function that
// fails to compile with one that raises a clear error. It repeats until the file compiles.
func stubMissingOps(dst string, info torchInfo) ([]string, error) {
	libtch := filepath.Join(dst, "libtch")
	abi := "0"
	if info.CXX11ABI {
		abi = "1"
	}
	args := []string{"-std=c++17", "-fsyntax-only", "-w", "-D_GLIBCXX_USE_CXX11_ABI=" + abi, "-I" + libtch}
	for _, inc := range info.Includes {
		args = append(args, "-I"+inc)
	}
	args = append(args, filepath.Join(libtch, "torch_api.cpp"))
	var stubbed []string
	for round := 1; round <= 6; round++ {
		fmt.Fprintf(os.Stderr, "torchsetup: compiling gotch's C++ wrappers against libtorch %s (round %d, about a minute)...\n", info.Version, round)
		cmd := exec.Command("g++", args...)
		out, err := cmd.CombinedOutput()
		if err == nil {
			sort.Strings(stubbed)
			return stubbed, nil
		}
		bad := map[string]map[int]bool{}
		for _, m := range errLine.FindAllStringSubmatch(string(out), -1) {
			var line int
			fmt.Sscan(m[2], &line)
			if bad[m[1]] == nil {
				bad[m[1]] = map[int]bool{}
			}
			bad[m[1]][line] = true
		}
		if len(bad) == 0 {
			return nil, fmt.Errorf("compiling gotch wrappers failed for a reason other than missing ops:\n%s", tail(string(out), 4000))
		}
		for file, lines := range bad {
			names, err := stubFunctions(filepath.Join(libtch, file), lines, info.Version)
			if err != nil {
				return nil, err
			}
			stubbed = append(stubbed, names...)
		}
	}
	return nil, fmt.Errorf("gotch wrappers still fail to compile after 6 rounds of stubbing")
}

var funcStart = regexp.MustCompile(`^([A-Za-z_][\w \*]*?)\s*\*?\s*\b(at[a-z]*_\w+)\(`)

// stubFunctions replaces the bodies of the top-level functions containing the given lines.
func stubFunctions(path string, lines map[int]bool, version string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	src := strings.Split(string(b), "\n")
	type span struct {
		start, end int
		name, ret  string
	}
	var spans []span
	seen := map[int]bool{}
	for line := range lines {
		i := line - 1
		for i >= 0 && !funcStart.MatchString(src[i]) {
			i--
		}
		if i < 0 {
			return nil, fmt.Errorf("%s:%d: error outside any wrapper function", path, line)
		}
		if seen[i] {
			continue
		}
		seen[i] = true
		m := funcStart.FindStringSubmatch(src[i])
		j := i
		for j < len(src) && src[j] != "}" {
			j++
		}
		if j == len(src) {
			return nil, fmt.Errorf("%s:%d: cannot find the end of %s", path, i+1, m[2])
		}
		ret := strings.TrimSpace(src[i][:strings.Index(src[i], m[2])])
		spans = append(spans, span{i, j, m[2], ret})
	}
	sort.Slice(spans, func(a, b int) bool { return spans[a].start > spans[b].start })
	var names []string
	for _, sp := range spans {
		// Keep the signature (up to and including the line that opens the body).
		k := sp.start
		for k <= sp.end && !strings.HasSuffix(strings.TrimSpace(src[k]), "{") {
			k++
		}
		op := strings.TrimPrefix(strings.TrimPrefix(sp.name, "atg_"), "at_")
		body := []string{fmt.Sprintf(`  PROTECT(throw std::runtime_error("op %s is not available in libtorch %s (drmas compiled it as a stub)");)`, op, version)}
		if sp.ret != "void" {
			body = append(body, "  return {};")
		}
		repl := append(append([]string{}, src[sp.start:k+1]...), body...)
		repl = append(repl, "}")
		src = append(src[:sp.start], append(repl, src[sp.end+1:]...)...)
		names = append(names, sp.name)
	}
	return names, os.WriteFile(path, []byte(strings.Join(src, "\n")), 0o644)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
