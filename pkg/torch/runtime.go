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

// glibc: keep freed memory for reuse instead of giving it back to the kernel and faulting it in
// again. glibc serves allocations above M_MMAP_THRESHOLD (128 KB by default) with a fresh mmap that
// is unmapped when freed, so every such tensor's pages fault in anew; setting any threshold by hand
// also freezes glibc's dynamic adjustment of it. Raise it to the largest value glibc accepts
// (HEAP_MAX_SIZE/2, 32 MB on 64-bit: mallopt refuses larger ones and returns 0) and keep up to
// trim_threshold free at the top of the heap. Returns 1 when glibc took both settings.
static int drmas_tune_glibc(size_t mmap_threshold, size_t trim_threshold) {
	int a = mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold);
	int b = mallopt(M_TRIM_THRESHOLD, (int)trim_threshold);
	return a == 1 && b == 1;
}

// drmas_heap: glibc's heap in use and free, in bytes (mallinfo2, looked up at run time: glibc ≥ 2.33;
// in use counts mmapped blocks too). Returns 0 without mallinfo2.
static int drmas_heap(size_t *used, size_t *free_bytes) {
	struct info { size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost; };
	struct info (*mi)(void) = (struct info (*)(void))dlsym(RTLD_DEFAULT, "mallinfo2");
	if (!mi) return 0;
	struct info i = mi();
	*used = i.uordblks + i.hblkhd;
	*free_bytes = i.fordblks;
	return 1;
}
*/
import "C"

import (
	"os"
	"runtime"
	"slices"
	"strconv"

	"github.com/rs/zerolog/log"
	lib "github.com/sugarme/gotch/libtch"
)

// Threads are the thread counts of libtorch and its matrix products.
type Threads struct {
	IntraOp int // libtorch intra-op (parallel kernels)
	InterOp int // libtorch inter-op (independent ops of a graph; drmas issues ops from one thread)
	BLAS    int // float32 matrix products: oneDNN's OpenMP threads, or OpenBLAS's own pool (see GEMM)
}

// DefaultThreads is what drmas runs with when a config or flag leaves a count at 0: one inter-op
// thread (drmas issues its ops from one thread), and for the matrix products OMP_NUM_THREADS when it
// is set (as torchrun and `drmas train --nproc` set it for each rank), else one thread per core.
// Intra-op threads: as many as the matrix products when oneDNN runs them (both share one OpenMP
// pool, so the elementwise kernels use the cores the products leave idle between them), and one
// with OpenBLAS, whose own workers spin between products and slowed libtorch's parallel kernels
// (measured in issue 12).
func DefaultThreads() Threads {
	blas := runtime.NumCPU()
	if n, err := strconv.Atoi(os.Getenv("OMP_NUM_THREADS")); err == nil && n > 0 {
		blas = n
	}
	intra := 1
	if GEMM() == GEMMOneDNN {
		intra = blas
	}
	return Threads{IntraOp: intra, InterOp: 1, BLAS: blas}
}

// SetupThreads applies t (0 = DefaultThreads' count) and returns the counts in effect. Both
// `drmas train` and `drmas bench` call it, so both run with the same choices. libtorch accepts an
// inter-op count only before any inter-op work has started; after that the count in effect stays.
// Call it on the torch thread.
func SetupThreads(t Threads) Threads {
	probeGEMM()
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
	setGEMMThreads(t.BLAS)
	return CurrentThreads()
}

// CurrentThreads returns the thread counts in effect; BLAS is the count of the library GEMM names
// (-1 for a BLAS other than OpenBLAS).
func CurrentThreads() Threads {
	blas := int(C.drmas_blas_threads())
	if GEMM() == GEMMOneDNN {
		blas = gemmThreads()
	}
	return Threads{IntraOp: lib.AtGetNumThreads(), InterOp: lib.AtGetNumInteropThreads(), BLAS: blas}
}

// Allocator names the C allocator libtorch's tensors come from: "glibc" (tuned at start-up, see
// drmas_tune_glibc), or "tcmalloc" when a user preloads it (LD_PRELOAD).
func Allocator() string {
	if C.drmas_allocator() == 1 {
		return "tcmalloc"
	}
	return "glibc"
}

// Thresholds of the glibc tuning.
const (
	mmapThreshold = 32 << 20 // allocations up to this size come from the heap (glibc's maximum)
	trimThreshold = 1 << 30  // glibc gives the heap's top back by itself only past this
)

// glibcTuned reports whether glibc accepted the thresholds (false with tcmalloc).
var glibcTuned bool

func init() {
	if C.drmas_allocator() == 0 {
		glibcTuned = C.drmas_tune_glibc(mmapThreshold, trimThreshold) == 1
	}
}

// AllocatorTuned reports whether the glibc thresholds above are in effect.
func AllocatorTuned() bool { return glibcTuned }

// release decides when ReleaseMemory trims: it remembers how much free heap the last calls found
// (what the steps between them need and reuse) and trims only after a spike.
var release trimRule

// ReleaseMemory hands free C heap memory back to the operating system after a spike: when glibc's
// heap holds more free memory than twice what the recent calls found (and at least 256 MB). Between
// steps of the same shape that never happens, so a training loop that calls it after every step
// never trims on the hot path (trimming after every step made the next one fault all its memory
// back in: more than half of a training step's time in the measurements of issue 12); after a
// larger one-off phase (a validation batch, a checkpoint load) the excess goes back. With tcmalloc
// it does nothing (tcmalloc returns memory gradually by itself). Call it between steps, on the
// torch thread.
func ReleaseMemory() {
	used, free, ok := CHeap() // not ok with tcmalloc
	if !ok {
		return
	}
	trim := release.observe(free)
	log.Debug().Int64("c_heap_used_mb", used>>20).Int64("c_heap_free_mb", free>>20).Bool("trim", trim).Msg("release memory")
	if trim {
		C.malloc_trim(0)
	}
}

// TrimMemory hands the free memory of glibc's heap back to the operating system now, whatever the
// recent calls found: after a one-off release (a model's whole weights cut into shards, pkg/train),
// never between steps (see ReleaseMemory). Torch thread.
func TrimMemory() {
	if _, _, ok := CHeap(); ok {
		C.malloc_trim(0)
	}
}

// CHeap returns the bytes glibc's malloc has handed out (libtorch's tensors among them) and the bytes
// it holds free for reuse; ok is false with another allocator.
func CHeap() (used, free int64, ok bool) {
	if C.drmas_allocator() != 0 {
		return 0, 0, false
	}
	var u, f C.size_t
	if C.drmas_heap(&u, &f) == 0 {
		return 0, 0, false
	}
	return int64(u), int64(f), true
}

// trimRule is ReleaseMemory's decision: trim when the free heap is past minTrim and more than
// twice the median of the last len(recent) observations (of those there are); on the first, only
// past trimThreshold (a model freed before the first step). A working set that is large from the
// start (a step that frees more than 1 GB) is trimmed at most once, not on every step until the
// history fills: that made a 31M-parameter bench step fault 1.9M pages and run at half speed.
type trimRule struct {
	recent [8]int64
	n      int // observations so far
}

const minTrim = 256 << 20

func (r *trimRule) observe(free int64) bool {
	k := min(r.n, len(r.recent))
	window := append([]int64(nil), r.recent[:k]...)
	r.recent[r.n%len(r.recent)] = free
	r.n++
	if free < minTrim {
		return false
	}
	if k == 0 { // no history: trim only what glibc would give back itself
		return free > trimThreshold
	}
	slices.Sort(window)
	return free > 2*window[k/2]
}
