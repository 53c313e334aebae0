//go:build drmas_overlay

// Added to gotch's libtch by scripts/torchsetup (see overlay.go): Go wrappers for libtorch functions
// that gotch declares in C (torch_api.h) but does not expose.

package libtch

//#include <stdbool.h>
//#include <stdlib.h>
//#include "torch_api.h"
import "C"

import "unsafe"

// AtManualSeed seeds libtorch's default generators.
func AtManualSeed(seed int64) { C.at_manual_seed(C.int64_t(seed)) }

// AtSetNumThreads sets libtorch's intra-op thread count.
func AtSetNumThreads(n int) { C.at_set_num_threads(C.int(n)) }

// AtGetNumThreads returns libtorch's intra-op thread count.
func AtGetNumThreads() int { return int(C.at_get_num_threads()) }

// AtSetNumInteropThreads sets libtorch's inter-op thread count. libtorch allows it once, before any
// inter-op work; it reports false (and leaves the count) otherwise.
func AtSetNumInteropThreads(n int) bool {
	C.at_set_num_interop_threads(C.int(n))
	if e := C.get_and_reset_last_err(); e != nil {
		C.free(unsafe.Pointer(e))
		return false
	}
	return true
}

// AtGetNumInteropThreads returns libtorch's inter-op thread count.
func AtGetNumInteropThreads() int { return int(C.at_get_num_interop_threads()) }
