package replica

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// CheckCPUs checks that every CPU of a CPU list (ParseCPUs) is one this process may run on — the
// machine's, less what taskset or a cgroup withholds — naming those that are not and the ones there
// are (before: the replica failed at start with "invalid argument").
func CheckCPUs(s string) error {
	cpus, err := ParseCPUs(s)
	if err != nil {
		return err
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil // the kernel will say at start
	}
	var missing []string
	for _, c := range cpus {
		if !set.IsSet(c) {
			missing = append(missing, fmt.Sprint(c))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var have []int
	for c := 0; c < 1024; c++ {
		if set.IsSet(c) {
			have = append(have, c)
		}
	}
	return fmt.Errorf("CPU list %q: CPU %s not on this machine (its CPUs: %s)", s, strings.Join(missing, ", "), FormatCPUs(have))
}
