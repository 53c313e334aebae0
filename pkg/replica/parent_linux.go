package replica

import (
	"os/exec"
	"syscall"
)

// DieWithParent has the kernel send a child drmas starts (a replica, a gateway runner, an MCP stdio
// server) SIGTERM when the process that started it dies, so that a trainer killed outright (SIGKILL,
// OOM) leaves none behind.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
}
