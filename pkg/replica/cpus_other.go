//go:build !linux

package replica

import (
	"errors"
	"os/exec"
)

func startOn(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) > 0 {
		return errors.New("pinning managed replicas to CPUs (rollout.cpus) needs Linux")
	}
	return cmd.Start()
}
