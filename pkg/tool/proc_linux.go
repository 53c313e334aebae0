package tool

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel send a stdio server SIGTERM when the process that started it dies, so
// that a trainer killed outright (SIGKILL, OOM) leaves no server behind.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
}
