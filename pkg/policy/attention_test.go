package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// needFused skips a test on a libtorch without the fused kernel (Debian's 1.13: tiles only).
func needFused(t *testing.T) {
	t.Helper()
	if !fusedAttention {
		t.Skip("this libtorch has no scaled_dot_product_attention (1.13) or DRMAS_ATTENTION=tiles: " +
			"run on libtorch 2.x (scripts/libtorch-check.sh cpu, or a GPU machine)")
	}
}

// The two implementations of the attention contract agree: libtorch's fused kernel against the
// tiles (forced to many tiles of 5 rows), causal over a whole sequence and one query after a cache,
// with grouped-query heads, in float32: outputs, and gradients (autograd through the kernel against
// attendBackward).
func TestFusedAttentionMatchesTiles(t *testing.T) {
	needFused(t)
	onTorch(t, func() error {
		B, H, KV, D := int64(2), int64(6), int64(2), int64(16)
		for _, c := range []struct{ T, S int64 }{{37, 37}, {1, 23}} {
			q := ts.MustRandn([]int64{B, H, c.T, D}, gotch.Float, gotch.CPU)
			k := ts.MustRandn([]int64{B, KV, c.S, D}, gotch.Float, gotch.CPU)
			v := ts.MustRandn([]int64{B, KV, c.S, D}, gotch.Float, gotch.CPU)
			dO := ts.MustRandn([]int64{B, c.T, H * D}, gotch.Float, gotch.CPU)
			sc := 1 / math.Sqrt(float64(D))
			scale := ts.MustFull([]int64{1}, ts.FloatScalar(sc), gotch.Float, gotch.CPU).MustSqueeze(true)
			sp := &attnSpec{past: c.S - c.T, scale: scale, scaleValue: sc, compute: gotch.Float}
			ql, kl, vl := leafCopy(q), leafCopy(k), leafCopy(v)
			o := fused(ql, kl, vl, sp)
			if o == nil {
				return fmt.Errorf("T %d, S %d: libtorch took no fused kernel for float32 on %v", c.T, c.S, q.MustDevice())
			}
			o.MustMul(dO, false).MustSum(gotch.Invalid, true).MustBackward()
			var want, dq, dk, dv *ts.Tensor
			_ = torch.NoGrad(func() error {
				defer smallTiles(5)()
				var lse *ts.Tensor
				want, lse = attendTiles(q, k, v, sp, true)
				dq, dk, dv = attendBackward(q, k, v, want, lse, dO, sp)
				return nil
			})
			for _, x := range []struct {
				name      string
				got, want *ts.Tensor
			}{{"output", o, want}, {"dq", ql.MustGrad(false), dq}, {"dk", kl.MustGrad(false), dk}, {"dv", vl.MustGrad(false), dv}} {
				if d := maxDiff(values(x.got), values(x.want)); d > 2e-5*(1+maxAbs(values(x.want))) {
					return fmt.Errorf("T %d, S %d: %s: fused and tiles differ by %.3g", c.T, c.S, x.name, d)
				}
			}
		}
		return nil
	})
}

// Where the fused kernel does not apply (left padding, a sliding window, queries after a cache), it
// declines, and attend takes the tiles.
func TestFusedAttentionDeclines(t *testing.T) {
	needFused(t)
	onTorch(t, func() error {
		q := ts.MustRandn([]int64{1, 2, 4, 8}, gotch.Float, gotch.CPU)
		k := ts.MustRandn([]int64{1, 2, 6, 8}, gotch.Float, gotch.CPU)
		scale := ts.MustFull([]int64{1}, ts.FloatScalar(0.35), gotch.Float, gotch.CPU).MustSqueeze(true)
		valid := ts.MustOnes([]int64{1, 4}, gotch.Bool, gotch.CPU)
		for name, sp := range map[string]*attnSpec{
			"padding": {valid: valid},
			"window":  {window: 2},
			"cache":   {past: 2},
		} {
			sp.scale, sp.scaleValue, sp.compute = scale, 0.35, gotch.Float
			kk := k
			if sp.past == 0 {
				kk = k.MustNarrow(2, 0, 4, false)
			}
			if o := fused(q, kk, kk, sp); o != nil {
				return fmt.Errorf("%s: the fused kernel ran where the tiles must", name)
			}
		}
		return nil
	})
}

// A model's training scores and gradients are the same with the fused kernel and with the tiles
// (float32, every family without a window; Mistral's window always takes the tiles).
func TestTrainScoreFusedMatchesTiles(t *testing.T) {
	needFused(t)
	rng := rand.New(rand.NewPCG(5, 6))
	seqs := make([]Sequence, 2)
	for i := range seqs {
		for range 5 + 4*i {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(48))
		}
		for range 8 - 3*i {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(48))
		}
	}
	for _, name := range arch.ModelTypes() {
		t.Run(name, func(t *testing.T) {
			m := randomModel(t, name, 48, gotch.Float, 0.2, 7)
			onTorch(t, func() error {
				w := ts.MustRandn([]int64{2, 8}, gotch.Float, gotch.CPU)
				u := ts.MustRandn([]int64{2, 8}, gotch.Float, gotch.CPU)
				run := func(fusedOn, checkpoint bool) ([]float64, map[string][]float64, error) {
					defer func(old bool) { fusedAttention = old }(fusedAttention)
					fusedAttention = fusedOn
					s := torch.NewScope()
					defer s.Close()
					sc, bp, err := m.TrainScore(seqs, true, checkpoint)
					if err != nil {
						return nil, nil, err
					}
					lp := values(sc.LogProbs)
					bp.Backward(gradLoss(sc, w, u))
					return lp, grads(m), nil
				}
				wantLP, want, err := run(false, false)
				if err != nil {
					return err
				}
				for _, checkpoint := range []bool{false, true} {
					lp, got, err := run(true, checkpoint)
					if err != nil {
						return err
					}
					if d := maxDiff(lp, wantLP); d > 1e-4 {
						return fmt.Errorf("checkpoint %v: log-probs differ by %.3g", checkpoint, d)
					}
					for k, g := range want {
						if d := maxDiff(got[k], g); d > 1e-4*(1+maxAbs(g)) {
							return fmt.Errorf("checkpoint %v: %s's gradient differs by %.3g (scale %.3g)", checkpoint, k, d, maxAbs(g))
						}
					}
				}
				return nil
			})
		})
	}
}

// attendRows (drmas's CPU kernel in float32, libtorch's ops row by row in float64) gives each row
// the attention of its query over its own slot's columns alone, as the tiles give it for that row by
// itself: rows of different ages, slots in any order (a step of live rows only), grouped-query heads
// of 1 and 3 queries per key/value head, a head size that is and one that is not a multiple of the
// kernel's eight lanes, with and without a sliding window, a row of one column, keys of very different
// sizes (scores far apart: the softmax's shift and its exp's flush to zero).
func TestAttendRowsMatchesEachRowAlone(t *testing.T) {
	onTorch(t, func() error {
		for _, dt := range []gotch.DType{gotch.Float, gotch.Double} {
			for _, c := range []struct{ H, KV, D, window int64 }{{4, 4, 64, 0}, {6, 2, 24, 0}, {6, 2, 40, 7}} {
				slots, S := []int64{3, 0, 4, 1}, int64(33)
				starts := []int64{0, 32, 20, 5}
				q := ts.MustRandn([]int64{4, c.H, 1, c.D}, dt, gotch.CPU)
				k := ts.MustRandn([]int64{5, c.KV, S, c.D}, dt, gotch.CPU).MustMul(ts.MustRandn([]int64{5, c.KV, S, 1}, dt, gotch.CPU).MustMulScalar(ts.FloatScalar(3), true), true)
				v := ts.MustRandn([]int64{5, c.KV, S, c.D}, dt, gotch.CPU)
				sc := 1 / math.Sqrt(float64(c.D))
				scale := ts.MustFull([]int64{1}, ts.FloatScalar(sc), dt, gotch.CPU).MustSqueeze(true)
				compute := gotch.Float
				if dt == gotch.Double {
					compute = gotch.Double
				}
				sp := &attnSpec{scale: scale, scaleValue: sc, compute: compute, window: c.window}
				got := values(attendRows(q, k, v, slots, starts, sp))
				var want []float64
				for i, b := range slots {
					first := starts[i]
					if c.window > 0 {
						first = max(first, S-c.window)
					}
					n := S - first
					kb := k.MustNarrow(0, b, 1, false).MustNarrow(2, first, n, true)
					vb := v.MustNarrow(0, b, 1, false).MustNarrow(2, first, n, true)
					one := &attnSpec{past: n - 1, scale: scale, scaleValue: sc, compute: compute}
					o, _ := attendTiles(q.MustNarrow(0, int64(i), 1, false), kb, vb, one, false)
					want = append(want, values(o)...)
				}
				tol := 1e-12
				if dt == gotch.Float {
					tol = 2e-6
				}
				if d := maxDiff(got, want); d > tol*(1+maxAbs(want)) {
					return fmt.Errorf("%v H %d KV %d D %d window %d: attendRows and each row alone differ by %.3g", dt, c.H, c.KV, c.D, c.window, d)
				}
			}
		}
		return nil
	})
}
