//go:build !linux

package replica

import "os/exec"

// dieWithParent is Linux's parent-death signal; elsewhere a replica outlives a trainer killed outright.
func dieWithParent(*exec.Cmd) {}
