package torch

import (
	"runtime"
	"testing"

	"github.com/drmas/drmas/pkg/plan"
)

// SetupThreads applies the counts it is given, fills zeros from DefaultThreads, and reports what is in
// effect.
func TestSetupThreads(t *testing.T) {
	Do(func() error {
		defer SetupThreads(Threads{})
		got := SetupThreads(Threads{IntraOp: 2, BLAS: 1})
		if got.IntraOp != 2 || got.InterOp != 1 {
			t.Errorf("SetupThreads(intra 2) = %+v, want intra-op 2, inter-op 1", got)
		}
		if got.BLAS != -1 && got.BLAS != 1 {
			t.Errorf("SetupThreads(BLAS 1) = %+v, want BLAS 1 (or -1 without OpenBLAS)", got)
		}
		d := SetupThreads(Threads{})
		if want := DefaultThreads(); d.IntraOp != want.IntraOp || (d.BLAS != -1 && d.BLAS != runtime.NumCPU()) {
			t.Errorf("SetupThreads(zero) = %+v, want the defaults %+v", d, want)
		}
		return nil
	})
}

func TestAllocator(t *testing.T) {
	if a := Allocator(); a != "glibc" && a != "tcmalloc" {
		t.Fatalf("Allocator() = %q", a)
	}
	if Allocator() == "glibc" && !AllocatorTuned() {
		t.Error("glibc refused the mmap or trim threshold: every tensor above 128 KB would be a fresh mmap")
	}
	ReleaseMemory() // must not crash with either allocator
}

// The trim rule keeps still between steps of one shape and trims after a spike.
func TestTrimRule(t *testing.T) {
	var r trimRule
	const mb = 1 << 20
	steady := int64(600 * mb)
	for i := range 20 {
		if r.observe(steady + int64(i%3)*mb) {
			t.Fatalf("observation %d: trimmed at the steady free size", i)
		}
	}
	if !r.observe(3 * steady) {
		t.Fatal("a spike to 3× the usual free heap was not trimmed")
	}
	if r.observe(steady) {
		t.Fatal("trimmed at the steady size right after a spike")
	}
	var small trimRule
	for range 10 {
		small.observe(1 * mb)
	}
	if small.observe(100 * mb) {
		t.Fatal("trimmed below the 256 MB floor")
	}
	var cold trimRule
	if cold.observe(600 * mb) {
		t.Fatal("trimmed 600 MB on the first observation (no history yet)")
	}
	if !cold.observe(3 << 30) {
		t.Fatal("kept 3 GB free on the second observation (past the 1 GB trim threshold)")
	}
	// A step that frees 1.2–1.5 GB from the start: the first observation is past the threshold, the
	// next ones are the same working set and must be kept.
	var big trimRule
	trims := 0
	for i := range 10 {
		if big.observe(int64(1200+30*min(i, 9)) * mb) {
			trims++
		}
	}
	if trims > 1 {
		t.Fatalf("a large steady working set was trimmed %d times in 10 steps (want at most once)", trims)
	}
}

// The memory plan counts what the C heap holds by the same threshold glibc is tuned to here.
func TestPlanHeapThreshold(t *testing.T) {
	if plan.HeapBlockMax != mmapThreshold {
		t.Errorf("plan.HeapBlockMax %d, glibc's M_MMAP_THRESHOLD here %d", plan.HeapBlockMax, mmapThreshold)
	}
}
