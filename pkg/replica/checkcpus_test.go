package replica

import (
	"runtime"
	"strings"
	"testing"
)

// A CPU list naming a CPU the machine does not have is refused where the config is checked, naming
// the CPU and the machine's CPUs (#52: rollout.cpus ["7"] on a 2-CPU machine passed --dry-run and
// failed at start with "invalid argument").
func TestCheckCPUs(t *testing.T) {
	if err := CheckCPUs("0"); err != nil {
		t.Errorf("CPU 0: %v", err)
	}
	err := CheckCPUs("0,1000-1001")
	if runtime.GOOS == "linux" && (err == nil || !strings.Contains(err.Error(), "CPU 1000, 1001 not on this machine (its CPUs: 0")) {
		t.Errorf("CPUs 1000-1001: %v", err)
	}
	if got := FormatCPUs([]int{0, 1, 2, 3, 6, 8, 9}); got != "0-3,6,8-9" {
		t.Errorf("FormatCPUs = %q", got)
	}
}
