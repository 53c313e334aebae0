//go:build linux

package replica

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseCPUs(t *testing.T) {
	for in, want := range map[string][]int{"3": {3}, "0-3": {0, 1, 2, 3}, "0,2,4-5": {0, 2, 4, 5}, "1,1": {1}} {
		got, err := ParseCPUs(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseCPUs(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "0-2000"} {
		if _, err := ParseCPUs(bad); err == nil {
			t.Errorf("ParseCPUs(%q) accepted", bad)
		}
	}
}

// A replica pinned to CPUs (rollout.cpus) runs with that affinity from its start, every thread, while
// the process that started it keeps its own.
func TestStartOnPinsTheChild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CPU affinity: Linux")
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil || mine.Count() < 2 {
		t.Skip("needs 2 CPUs to tell a pinned child from its parent")
	}
	last := -1
	for c := 0; c < 1024; c++ {
		if mine.IsSet(c) {
			last = c
		}
	}
	cmd := exec.Command("sleep", "10")
	if err := startOn(cmd, []int{last}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	status, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "Cpus_allowed_list:\t"+strconv.Itoa(last)+"\n") {
		t.Errorf("the child's affinity: %s; want CPU %d alone", line(string(status), "Cpus_allowed_list"), last)
	}
	var after unix.CPUSet
	runtime.LockOSThread()
	_ = unix.SchedGetaffinity(0, &after)
	runtime.UnlockOSThread()
	if after != mine {
		t.Errorf("the parent's affinity changed: %d CPUs, was %d", after.Count(), mine.Count())
	}
}

func line(s, key string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, key) {
			return l
		}
	}
	return ""
}
