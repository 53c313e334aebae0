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
