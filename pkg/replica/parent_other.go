//go:build !linux

package replica

import "os/exec"

// DieWithParent is Linux's parent-death signal; elsewhere a child outlives a trainer killed outright.
func DieWithParent(*exec.Cmd) {}
