package optim

import (
	"slices"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// params makes two parameters of the given dtype with gradients, the same values every call.
func params(dt gotch.DType) []*ts.Tensor {
	var out []*ts.Tensor
	for k, n := range []int{12, 5} {
		v, c := make([]float32, n), make([]float32, n)
		for i := range v {
			v[i] = float32((i*7+k*3)%11-5) / 4
			c[i] = float32((i*5+k)%9-4) / 3
		}
		p := ts.MustOfSlice(v).MustTotype(dt, true).MustSetRequiresGrad(true, true)
		w := ts.MustOfSlice(c).MustTotype(dt, true)
		loss := p.MustMul(p, false).MustMul(w, true).MustSum(dt, true) // gradient 2·p·w
		loss.MustBackward()
		out = append(out, p)
	}
	return out
}

// With Offload the state is host tensors of their own (a master copy of float32 parameters too) and
// three steps leave the parameters, moments and master weights bit-equal to the steps without it.
func TestOffloadSameSteps(t *testing.T) {
	torch.Do(func() error {
		for _, dt := range []gotch.DType{gotch.Float, gotch.BFloat16} {
			var got [2][][]float64
			for k, offload := range []bool{false, true} {
				ps := params(dt)
				o := NewAdamW([]string{"a", "b"}, ps, AdamWOptions{LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Offload: offload})
				for i := range ps {
					if offload != (o.Master[i] != nil) && dt == gotch.Float {
						t.Errorf("%v offload %v: master copy %v", dt, offload, o.Master[i] != nil)
					}
					if o.SavedMaster(i) != (dt != gotch.Float) {
						t.Errorf("%v offload %v: saved master %v", dt, offload, o.SavedMaster(i))
					}
				}
				if o.Device().Name != "CPU" {
					t.Errorf("state on %v", o.Device())
				}
				for step := 0; step < 3; step++ {
					o.Apply(o.CurrentLR())
				}
				for i, p := range ps {
					got[k] = append(got[k], p.MustTotype(gotch.Double, false).Float64Values(), o.M[i].Float64Values(), o.V[i].Float64Values())
					if o.SavedMaster(i) {
						got[k] = append(got[k], o.Master[i].Float64Values())
					}
				}
				// SyncMaster: weights changed outside the optimizer reach the master copies.
				_ = torch.NoGrad(func() error { ps[0].MustZero_(); return nil })
				o.SyncMaster()
				if o.Master[0] != nil && slices.Max(o.Master[0].MustAbs(false).Float64Values()) != 0 {
					t.Errorf("%v offload %v: master copy not synced", dt, offload)
				}
				o.Free()
			}
			if len(got[0]) != len(got[1]) {
				t.Fatalf("%v: %d vs %d tensors", dt, len(got[0]), len(got[1]))
			}
			for i := range got[0] {
				if !slices.Equal(got[0][i], got[1][i]) {
					t.Errorf("%v tensor %d: %v without offload, %v with", dt, i, got[0][i], got[1][i])
				}
			}
		}
		return nil
	})
}
