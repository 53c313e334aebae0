package torch

import (
	"slices"
	"strings"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

func TestRead(t *testing.T) {
	err := Do(func() error {
		s := NewScope()
		defer s.Close()
		x := ts.MustArange(ts.IntScalar(6), gotch.Float, gotch.CPU).MustView([]int64{2, 3}, true)
		got := make([]float32, 6)
		if err := Read(x.MustT(false), got); err != nil { // transposed: read in its logical order
			return err
		}
		if want := []float32{0, 3, 1, 4, 2, 5}; !slices.Equal(got, want) {
			t.Errorf("transposed read %v, want %v", got, want)
		}
		ids := make([]int64, 2)
		if err := Read(ts.MustOfSlice([]int64{7, -9, 11}), ids); err != nil || !slices.Equal(ids, []int64{7, -9}) {
			t.Errorf("int64 prefix read %v (%v), want [7 -9]", ids, err)
		}
		if err := Read(x, make([]float64, 6)); err == nil || !strings.Contains(err.Error(), "float64") && !strings.Contains(err.Error(), "Double") {
			t.Errorf("float32 tensor into []float64: err %v, want a dtype error", err)
		}
		if err := Read(x, make([]float32, 7)); err == nil {
			t.Error("7 elements read from a tensor of 6: no error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkRead reads 16M float32 (64 MB, a layer of a 7B model) to the host: Read against gotch's
// CopyData.
func BenchmarkRead(b *testing.B) {
	x := ts.MustOnes([]int64{16 << 20}, gotch.Float, gotch.CPU)
	defer x.MustDrop()
	dst := make([]float32, 16<<20)
	b.Run("Read", func(b *testing.B) {
		b.SetBytes(4 << 24)
		for b.Loop() {
			MustRead(x, dst)
		}
	})
	b.Run("CopyData", func(b *testing.B) {
		b.SetBytes(4 << 24)
		for b.Loop() {
			x.MustCopyData(dst, uint(len(dst)))
		}
	})
}
