package torch

import (
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

func TestVersion(t *testing.T) {
	if v := Version(); !strings.Contains(v, ".") {
		t.Fatalf("Version() = %q, want a dotted version", v)
	}
}

// A real computation: fit y = 3x + 2 with forward, backward and a gradient step.
func TestTrainLinear(t *testing.T) {
	err := Do(func() error {
		ManualSeed(1)
		xs := make([]float32, 64)
		ys := make([]float32, 64)
		for i := range xs {
			xs[i] = float32(i)/32 - 1
			ys[i] = 3*xs[i] + 2
		}
		x := ts.MustOfSlice(xs).MustView([]int64{64, 1}, true)
		y := ts.MustOfSlice(ys).MustView([]int64{64, 1}, true)
		w := ts.MustZeros([]int64{1, 1}, gotch.Float, gotch.CPU).MustSetRequiresGrad(true, true)
		b := ts.MustZeros([]int64{1}, gotch.Float, gotch.CPU).MustSetRequiresGrad(true, true)
		var loss float64
		for step := 0; step < 300; step++ {
			s := NewScope()
			pred := x.MustMatmul(w, false).MustAdd(b, true)
			l := pred.MustSub(y, true).MustSquare(true).MustMean(gotch.Float, true)
			w.ZeroGrad()
			b.ZeroGrad()
			l.MustBackward()
			loss = l.Float64Values()[0]
			err := NoGrad(func() error {
				for _, p := range []*ts.Tensor{w, b} {
					p.MustSub_(p.MustGrad(false).MustMulScalar(ts.FloatScalar(0.3), true))
				}
				return nil
			})
			s.Close()
			if err != nil {
				return err
			}
		}
		wv, bv := w.Float64Values()[0], b.Float64Values()[0]
		if loss > 1e-4 || math.Abs(wv-3) > 0.01 || math.Abs(bv-2) > 0.01 {
			t.Fatalf("after training: loss %g, w %g, b %g; want ≈0, 3, 2", loss, wv, bv)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestNoGradNests(t *testing.T) {
	Do(func() error {
		_ = NoGrad(func() error {
			_ = NoGrad(func() error { return nil })
			if ts.MustGradSetEnabled(false) {
				t.Fatal("inner NoGrad re-enabled gradients")
			}
			return nil
		})
		if !ts.MustGradSetEnabled(true) {
			t.Fatal("NoGrad did not restore gradient mode")
		}
		return nil
	})
}

func TestScopeFreesAllButKept(t *testing.T) {
	Do(func() error {
		outer := NewScope()
		var tmp, kept *ts.Tensor
		inner := NewScope()
		a := ts.MustOnes([]int64{4}, gotch.Float, gotch.CPU)
		tmp = a.MustMulScalar(ts.FloatScalar(2), false)
		kept = tmp.MustAdd(a, false)
		inner.Keep(kept)
		inner.Close()
		if a.Ctensor() != nil || tmp.Ctensor() != nil {
			t.Fatal("scope did not free its intermediates")
		}
		if got := kept.Float64Values(); got[0] != 3 {
			t.Fatalf("kept tensor = %v, want 3s", got)
		}
		outer.Close()
		if kept.Ctensor() != nil {
			t.Fatal("kept tensor was not handed to the enclosing scope")
		}
		return nil
	})
}

// The ballast fix: gotch attached a 100 KB Go array to every tensor wrapper.
func TestGoBytesPerTinyOp(t *testing.T) {
	Do(func() error {
		x := ts.MustOnes([]int64{8}, gotch.Float, gotch.CPU)
		defer x.MustDrop()
		const n = 20000
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := 0; i < n; i++ {
			x.MustAdd(x, false).MustDrop()
		}
		runtime.ReadMemStats(&after)
		perOp := float64(after.TotalAlloc-before.TotalAlloc) / n
		t.Logf("Go bytes allocated per tiny op: %.0f", perOp)
		if perOp > 1024 {
			t.Fatalf("Go allocates %.0f bytes per tiny op, want < 1 KB", perOp)
		}
		return nil
	})
}

// The malloc(0) fix: every generated op leaked its output slot.
func TestResidentMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("1M ops")
	}
	Do(func() error {
		x := ts.MustOnes([]int64{8}, gotch.Float, gotch.CPU)
		defer x.MustDrop()
		loop := func(n int) {
			for i := 0; i < n; i++ {
				x.MustAdd(x, false).MustDrop()
			}
		}
		loop(100000)
		runtime.GC()
		start := rss(t)
		loop(1000000)
		runtime.GC()
		end := rss(t)
		t.Logf("resident memory: %d KB after warm-up, %d KB after 1M more ops", start/1024, end/1024)
		if float64(end) > 1.10*float64(start) {
			t.Fatalf("resident memory grew from %d KB to %d KB over 1M ops (> 10%%)", start/1024, end/1024)
		}
		return nil
	})
}

// The in-place fix: each in-place op (Add_, MulScalar_, Zero_ …) leaked the tensor handle it replaced
// (32 bytes of C heap, and a reference to the tensor), so AdamW and gradient clipping grew the heap
// every step. 50,000 in-place ops must leave glibc's heap in use where it was (unpatched: +1.6 MB).
func TestInPlaceOpsDoNotLeak(t *testing.T) {
	Do(func() error {
		x := ts.MustOnes([]int64{8}, gotch.Float, gotch.CPU)
		defer x.MustDrop()
		one := ts.FloatScalar(1)
		loop := func(n int) {
			for i := 0; i < n; i++ {
				x.MustAddScalar_(one)
				x.MustZero_()
			}
		}
		loop(1000)
		runtime.GC()
		before, _, ok := CHeap()
		if !ok {
			t.Skip("not glibc malloc")
		}
		loop(25000)
		runtime.GC()
		after, _, _ := CHeap()
		t.Logf("C heap in use: %d KB before, %d KB after 50,000 in-place ops", before/1024, after/1024)
		if after-before > 128<<10 {
			t.Fatalf("C heap in use grew by %d KB over 50,000 in-place ops: in-place ops leak their handles", (after-before)/1024)
		}
		if got := x.Float64Values(); got[0] != 0 {
			t.Fatalf("x = %v after Zero_, want 0", got)
		}
		return nil
	})
}

// Scalars made inside a scope are freed when it closes, not at a later garbage collection (which
// left small C blocks splitting the heap's free space: an AdamW step over a 0.6B model grew the heap
// by 5.1 GB). With the garbage collector off, 100,000 scalars leave the C heap where it was.
func TestScopeFreesScalars(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	Do(func() error {
		before, _, ok := CHeap()
		if !ok {
			t.Skip("not glibc malloc")
		}
		s := NewScope()
		x := ts.MustOnes([]int64{4}, gotch.Float, gotch.CPU)
		for i := 0; i < 100000; i++ {
			x.MustMulScalar_(ts.FloatScalar(1))
		}
		during, _, _ := CHeap()
		s.Close()
		after, _, _ := CHeap()
		t.Logf("C heap in use: %d KB before, %d KB with 100,000 scalars, %d KB after Close", before>>10, during>>10, after>>10)
		if during-before < 1<<20 {
			t.Fatalf("100,000 scalars took only %d KB: the test does not see them", (during-before)>>10)
		}
		if after-before > 256<<10 {
			t.Fatalf("C heap in use %d KB above its start after Close: the scope did not free its scalars", (after-before)>>10)
		}
		return nil
	})
}

func rss(t *testing.T) int64 {
	n := ResidentBytes()
	if n == 0 {
		t.Skip("no /proc/self/statm")
	}
	return n
}

func BenchmarkTinyOp(b *testing.B) {
	Do(func() error {
		x := ts.MustOnes([]int64{8}, gotch.Float, gotch.CPU)
		defer x.MustDrop()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			x.MustAdd(x, false).MustDrop()
		}
		return nil
	})
}

// A job that ends its goroutine (t.Fatal does) must not leave the torch thread dead.
func TestDoSurvivesGoexit(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		Do(func() error { runtime.Goexit(); return nil })
	}()
	<-done
	ran := false
	Do(func() error { ran = true; return nil })
	if !ran {
		t.Fatal("Do did not run after a job called runtime.Goexit")
	}
}
