package torch

import (
	"os"
	"strconv"
	"strings"
)

// ResidentBytes is the process's resident memory (libtorch's allocations included), read from
// /proc/self/statm; 0 where that file does not exist.
func ResidentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}
