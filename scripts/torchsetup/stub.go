package main

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// errLine matches a compiler error in one of the wrapper files: the file and the line.
var errLine = regexp.MustCompile(`(?m)^([^:\n]*torch_api\w*\.cpp):(\d+):\d+: error:`)

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
