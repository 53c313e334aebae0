package torch

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <malloc.h>
#include <stddef.h>

// OpenBLAS keeps its own thread pool, which libtorch's set_num_threads does not reach. Its controls
// are looked up at run time, so that nothing breaks when libtorch uses another BLAS (MKL, or none).
static int drmas_blas_threads(void) {
	int (*get)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
	return get ? get() : -1;
}

static int drmas_set_blas_threads(int n) {
	void (*set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
	if (!set) return 0;
	set(n);
	return 1;
}

// drmas_allocator: 1 when malloc is tcmalloc's (linked or preloaded), 0 for glibc's.
static int drmas_allocator(void) {
	void *tc = dlsym(RTLD_DEFAULT, "tc_malloc");
	return tc != NULL && tc == dlsym(RTLD_DEFAULT, "malloc");
}

// glibc: keep freed memory for reuse instead of giving it back to the kernel (and faulting it in
// again) after every step: a fixed mmap threshold (which also stops glibc from moving it, and the
// trim threshold with it, as tensors are freed) and a trim threshold beyond any step's churn.
static void drmas_tune_glibc(size_t mmap_threshold, size_t trim_threshold) {
	mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold);
	mallopt(M_TRIM_THRESHOLD, (int)trim_threshold);
}

// drmas_heap_free: bytes glibc's heap holds free (mallinfo2, looked up at run time: glibc ≥ 2.33).
static size_t drmas_heap_free(void) {
	struct info { size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost; };
	struct info (*mi)(void) = (struct info (*)(void))dlsym(RTLD_DEFAULT, "mallinfo2");
	if (!mi) return 0;
	return mi().fordblks;
}
*/
import "C"

import (
	"runtime"

	lib "github.com/sugarme/gotch/libtch"
)

// Threads are the thread counts of libtorch and its BLAS.
type Threads struct {
	IntraOp int // libtorch intra-op (parallel kernels)
	InterOp int // libtorch inter-op (independent ops of a graph; drmas issues ops from one thread)
	BLAS    int // OpenBLAS's own pool (-1 when libtorch uses another BLAS)
}

// DefaultThreads is what drmas runs with when a config or flag leaves a count at 0: one intra-op and
// one inter-op thread (drmas's ops run one after another on one thread, and on CPU their time is
// in BLAS), and one BLAS thread per core for the matrix products.
func DefaultThreads() Threads {
	return Threads{IntraOp: 1, InterOp: 1, BLAS: runtime.NumCPU()}
}

// SetupThreads applies t (0 = DefaultThreads' count) and returns the counts in effect. Both
// `drmas train` and `drmas bench` call it, so both run with the same choices. libtorch accepts an
// inter-op count only before any inter-op work has started; after that the count in effect stays.
// Call it on the torch thread.
func SetupThreads(t Threads) Threads {
	d := DefaultThreads()
	if t.IntraOp <= 0 {
		t.IntraOp = d.IntraOp
	}
	if t.InterOp <= 0 {
		t.InterOp = d.InterOp
	}
	if t.BLAS <= 0 {
		t.BLAS = d.BLAS
	}
	lib.AtSetNumThreads(t.IntraOp)
	if lib.AtGetNumInteropThreads() != t.InterOp {
		lib.AtSetNumInteropThreads(t.InterOp)
	}
	C.drmas_set_blas_threads(C.int(t.BLAS))
	return CurrentThreads()
}

// CurrentThreads returns the thread counts in effect.
func CurrentThreads() Threads {
	return Threads{IntraOp: lib.AtGetNumThreads(), InterOp: lib.AtGetNumInteropThreads(), BLAS: int(C.drmas_blas_threads())}
}

// Allocator names the C allocator libtorch's tensors come from: "tcmalloc" (linked by set-up when
// Debian's libtcmalloc-minimal4 is installed) or "glibc".
func Allocator() string {
	if C.drmas_allocator() == 1 {
		return "tcmalloc"
	}
	return "glibc"
}

// Thresholds of the glibc tuning and of ReleaseMemory.
const (
	mmapThreshold = 256 << 20 // allocations from the heap up to this size
	trimThreshold = 1 << 30   // glibc gives the heap's top back only past this
	releaseAbove  = 256 << 20 // ReleaseMemory trims only when the heap holds this much free
)

func init() {
	if C.drmas_allocator() == 0 {
		C.drmas_tune_glibc(mmapThreshold, trimThreshold)
	}
}

// ReleaseMemory hands free C heap memory back to the operating system, but only when glibc's heap
// holds more than 256 MB of it: trimming after every step made the next step fault all its memory
// back in (more than half of a training step's time in the measurements of issue 12). With
// tcmalloc it does nothing (tcmalloc returns memory gradually by itself). Call it between steps.
func ReleaseMemory() {
	if C.drmas_allocator() == 0 && C.drmas_heap_free() > releaseAbove {
		C.malloc_trim(0)
	}
}
