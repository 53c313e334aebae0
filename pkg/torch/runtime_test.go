package torch

import (
	"runtime"
	"testing"
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
	ReleaseMemory() // must not crash with either allocator
}
