//go:build linux

package replica

import (
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// startOn starts cmd with its CPU affinity set to cpus (none: as the parent's). The child inherits
// the affinity of the thread that forks it, before any of its threads exist, so the forking thread
// takes the set for the start and gives it back after.
func startOn(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return err
	}
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return err
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &old); rerr != nil && err == nil {
		err = rerr
	}
	return err
}
