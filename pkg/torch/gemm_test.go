package torch

import (
	"math"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// libtorch's float32 products give the same results on oneDNN as on the linked BLAS: every
// combination of transposed operands, strided views (leading dimensions larger than the rows),
// alpha and beta (addmm), batched products, and shapes down to one row.
func TestGEMMMatchesBLAS(t *testing.T) {
	if err := SetGEMM("auto"); err != nil {
		t.Fatal(err)
	}
	if GEMM() != GEMMOneDNN {
		t.Skip("this libtorch has no oneDNN sgemm: products run on its BLAS only")
	}
	defer SetGEMM("auto")
	Do(func() error {
		s := NewScope()
		defer s.Close()
		ManualSeed(3)
		wide := ts.MustRandn([]int64{70, 90}, gotch.Float, gotch.CPU)
		a := wide.MustNarrow(1, 5, 33, false) // [70, 33] with a row stride of 90
		b := ts.MustRandn([]int64{33, 41}, gotch.Float, gotch.CPU)
		c := ts.MustRandn([]int64{70, 41}, gotch.Float, gotch.CPU)
		bt := ts.MustRandn([]int64{41, 33}, gotch.Float, gotch.CPU)
		at := ts.MustRandn([]int64{33, 70}, gotch.Float, gotch.CPU)
		row := ts.MustRandn([]int64{1, 33}, gotch.Float, gotch.CPU)
		x := ts.MustRandn([]int64{6, 17, 9}, gotch.Float, gotch.CPU)
		y := ts.MustRandn([]int64{6, 9, 13}, gotch.Float, gotch.CPU)
		products := map[string]func() *ts.Tensor{
			"a·b":         func() *ts.Tensor { return a.MustMm(b, false) },
			"a·btᵀ":       func() *ts.Tensor { return a.MustMm(bt.MustT(false), false) },
			"atᵀ·b":       func() *ts.Tensor { return at.MustT(false).MustMm(b, false) },
			"atᵀ·btᵀ":     func() *ts.Tensor { return at.MustT(false).MustMm(bt.MustT(false), false) },
			"row·b":       func() *ts.Tensor { return row.MustMm(b, false) },
			"addmm":       func() *ts.Tensor { return c.MustAddmm(a, b, false).MustMulScalar(ts.FloatScalar(0.5), true) },
			"linear":      func() *ts.Tensor { return ts.MustLinear(a, bt, ts.None) },
			"bmm":         func() *ts.Tensor { return x.MustBmm(y, false) },
			"bmm of view": func() *ts.Tensor { return x.MustTranspose(1, 2, false).MustBmm(x, false) },
		}
		for name, f := range products {
			calls := gemmProducts()
			onednn := f()
			if gemmProducts() == calls {
				t.Errorf("%s: oneDNN ran no product", name)
			}
			SetGEMM(GEMMBLAS)
			blas := f()
			SetGEMM("auto")
			diff := onednn.MustSub(blas, false).MustAbs(true).MustMax(true).Float64Values()[0]
			scale := blas.MustAbs(false).MustMax(true).Float64Values()[0]
			if !(diff <= 1e-5*math.Max(1, scale)) {
				t.Errorf("%s: oneDNN and BLAS differ by %g (largest |value| %g)", name, diff, scale)
			}
		}
		return nil
	})
}

func TestSetGEMMRejectsUnknown(t *testing.T) {
	if err := SetGEMM("mkl"); err == nil {
		t.Fatal(`SetGEMM("mkl") = nil, want an error`)
	}
	if err := SetGEMM(GEMMBLAS); err != nil || GEMM() != GEMMBLAS {
		t.Fatalf("SetGEMM(blas) = %v, GEMM() = %s", err, GEMM())
	}
	if err := SetGEMM("auto"); err != nil {
		t.Fatal(err)
	}
}
