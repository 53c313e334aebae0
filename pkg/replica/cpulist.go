package replica

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseCPUs reads a CPU list as taskset and /sys write it: "3", "0-3", "0,2,4-5".
func ParseCPUs(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU number or range (want e.g. 3, 0-3, 0,2)", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("CPU list %q: %q is not a range low-high", s, part)
			}
		}
		if b >= 1024 {
			return nil, fmt.Errorf("CPU list %q: CPU %d is beyond 1023", s, b)
		}
		for c := a; c <= b; c++ {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// FormatCPUs writes sorted CPUs as a CPU list, ranges joined: 0-3,6.
func FormatCPUs(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		} else {
			parts = append(parts, fmt.Sprint(cpus[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
