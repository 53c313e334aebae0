//go:build !linux

package tool

import "os/exec"

// dieWithParent is Linux's parent-death signal; elsewhere a stdio server outlives a trainer killed
// outright.
func dieWithParent(*exec.Cmd) {}
