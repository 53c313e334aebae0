//go:build !linux

package replica

// CheckCPUs checks a CPU list's syntax (ParseCPUs); only Linux tells which CPUs a process may use.
func CheckCPUs(s string) error {
	_, err := ParseCPUs(s)
	return err
}
