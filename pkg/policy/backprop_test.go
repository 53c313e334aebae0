package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// gradLoss is a loss on the scores whose gradient reaches every log-prob and entropy with a weight
// of its own: Σ w·logp + Σ u·entropy.
func gradLoss(sc Scores, w, u *ts.Tensor) *ts.Tensor {
	loss := sc.LogProbs.MustMul(w, false).MustSum(gotch.Invalid, true)
	if sc.Entropy != nil {
		loss = loss.MustAdd(sc.Entropy.MustMul(u, false).MustSum(gotch.Invalid, true), true)
	}
	return loss
}

// grads reads every parameter's gradient and zeroes it.
func grads(m *Model) map[string][]float64 {
	out := map[string][]float64{}
	for _, p := range m.Parameters() {
		g := p.T.MustGrad(false)
		if g.MustDefined() {
			out[p.Name] = g.Float64Values()
			g.MustZero_()
		}
		g.MustDrop()
	}
	return out
}

// TrainScore's pieced backward (explicit attention backward over tiles, lm_head in chunks,
// with and without checkpointing) gives the gradients that autograd gives through Score, for every
// family (Mistral's window spans tiles), in float64, and the same log-probs and entropies.
func TestTrainScoreGradientsMatchAutograd(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	seqs := make([]Sequence, 3)
	for i := range seqs {
		for range 4 + 3*i {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(48))
		}
		for range 9 - 2*i {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(48))
		}
	}
	for _, name := range arch.ModelTypes() {
		t.Run(name, func(t *testing.T) {
			m := randomModel(t, name, 48, gotch.Double, 0.2, 5)
			onTorch(t, func() error {
				R := int64(9)
				w := ts.MustRandn([]int64{3, R}, gotch.Double, gotch.CPU)
				u := ts.MustRandn([]int64{3, R}, gotch.Double, gotch.CPU)
				want, err := m.Score(seqs, true, 0)
				if err != nil {
					return err
				}
				gradLoss(want, w, u).MustBackward()
				ref := grads(m)
				wantLP, wantEnt := values(want.LogProbs), values(want.Entropy)
				for _, c := range []struct {
					checkpoint bool
					tile       int64
					chunk      int64
				}{{false, 0, 0}, {true, 0, 0}, {false, 2, 5}, {true, 3, 7}} {
					restore := func() {}
					if c.tile > 0 {
						restore = smallTiles(c.tile)
					}
					budget := logitsBudget
					if c.chunk > 0 {
						logitsBudget = c.chunk * 48
					}
					err := func() error {
						defer restore()
						defer func() { logitsBudget = budget }()
						s := torch.NewScope()
						defer s.Close()
						sc, bp, err := m.TrainScore(seqs, true, c.checkpoint)
						if err != nil {
							return err
						}
						if d := maxDiff(values(sc.LogProbs), wantLP); d > 1e-10 {
							return fmt.Errorf("%+v: log-probs differ by %.3g", c, d)
						}
						if d := maxDiff(values(sc.Entropy), wantEnt); d > 1e-10 {
							return fmt.Errorf("%+v: entropies differ by %.3g", c, d)
						}
						bp.Backward(gradLoss(sc, w, u))
						got := grads(m)
						if len(got) != len(ref) {
							return fmt.Errorf("%+v: %d parameters have a gradient, autograd gives %d", c, len(got), len(ref))
						}
						var bad []string
						for k, g := range ref {
							if d := maxDiff(got[k], g); d > 1e-9*(1+maxAbs(g)) {
								bad = append(bad, fmt.Sprintf("%s: by %.3g (scale %.3g)", k, d, maxAbs(g)))
							}
						}
						if len(bad) > 0 {
							sort.Strings(bad)
							return fmt.Errorf("%+v: gradients differ from autograd's:\n%s", c, strings.Join(bad, "\n"))
						}
						return nil
					}()
					if err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

// A tile's explicit backward, checked alone against autograd: left padding (valid keys), queries
// after cached keys (past > 0) and a window, over tiles of one and three rows, in float64.
func TestAttendBackwardMatchesAutograd(t *testing.T) {
	onTorch(t, func() error {
		B, H, KV, T, S, D := int64(2), int64(4), int64(2), int64(7), int64(10), int64(3)
		q := ts.MustRandn([]int64{B, H, T, D}, gotch.Double, gotch.CPU)
		k := ts.MustRandn([]int64{B, KV, S, D}, gotch.Double, gotch.CPU)
		v := ts.MustRandn([]int64{B, KV, S, D}, gotch.Double, gotch.CPU)
		valid := ts.MustOnes([]int64{B, S}, gotch.Bool, gotch.CPU)
		valid.MustNarrow(1, 0, 2, false).MustNarrow(0, 1, 1, true).MustFill_(ts.IntScalar(0))
		dO := ts.MustRandn([]int64{B, T, H * D}, gotch.Double, gotch.CPU)
		scale := ts.MustFull([]int64{1}, ts.FloatScalar(1/math.Sqrt(float64(D))), gotch.Double, gotch.CPU).MustSqueeze(true)
		for _, window := range []int64{0, 4} {
			for _, rows := range []int64{1, 3, T} {
				sp := &attnSpec{past: S - T, window: window, valid: valid, scale: scale, compute: gotch.Double}
				restore := smallTiles(rows)
				ql, kl, vl := leafCopy(q), leafCopy(k), leafCopy(v)
				o, _ := attendTiles(ql, kl, vl, sp, false)
				o.MustMul(dO, false).MustSum(gotch.Invalid, true).MustBackward()
				var o2, lse, dq, dk, dv *ts.Tensor
				_ = torch.NoGrad(func() error {
					o2, lse = attendTiles(q, k, v, sp, true)
					dq, dk, dv = attendBackward(q, k, v, o2, lse, dO, sp)
					return nil
				})
				restore()
				if d := maxDiff(values(o2), values(o)); d > 1e-12 {
					return fmt.Errorf("window %d, tiles of %d: outputs differ by %.3g", window, rows, d)
				}
				for _, c := range []struct {
					name      string
					got, want *ts.Tensor
				}{{"dq", dq, ql.MustGrad(false)}, {"dk", dk, kl.MustGrad(false)}, {"dv", dv, vl.MustGrad(false)}} {
					if d := maxDiff(values(c.got), values(c.want)); d > 1e-12 {
						return fmt.Errorf("window %d, tiles of %d: %s differs from autograd's by %.3g", window, rows, c.name, d)
					}
				}
			}
		}
		return nil
	})
}

// A training forward never holds a score matrix of the whole sequence: with tiles of 4 rows a
// 64-token sequence's attention makes no tensor of 64 × 64 scores per head. Checked through the
// size of every tensor created in the scope.
func TestTrainScoreHoldsNoFullScoreMatrix(t *testing.T) {
	m := randomModel(t, arch.Llama, 48, gotch.Float, 0.2, 5)
	defer smallTiles(4)()
	var seq Sequence
	for i := range 64 {
		if i < 16 {
			seq.PromptIDs = append(seq.PromptIDs, i%48)
		} else {
			seq.ResponseIDs = append(seq.ResponseIDs, i%48)
		}
	}
	onTorch(t, func() error {
		largest := int64(0)
		prev := ts.NewTensorHook
		ts.NewTensorHook = func(x *ts.Tensor) {
			prev(x)
			n := int64(1)
			for _, d := range x.MustSize() {
				n *= d
			}
			largest = max(largest, n)
		}
		defer func() { ts.NewTensorHook = prev }()
		sc, bp, err := m.TrainScore([]Sequence{seq}, true, true)
		if err != nil {
			return err
		}
		bp.Backward(sc.LogProbs.MustSum(gotch.Invalid, false).MustAdd(sc.Entropy.MustSum(gotch.Invalid, false), true))
		// One head's full scores would be 64 × 64 per head, 4 heads: 16,384 elements. The largest
		// tensors are the MLP's [64, 64] activations and the embeddings; a tile's scores are
		// [1, 2, 2·4, 64] = 1,024.
		if full := int64(4 * 64 * 64); largest >= full {
			return fmt.Errorf("a tensor of %d elements exists (a full score matrix has %d)", largest, full)
		}
		return nil
	})
}

func leafCopy(x *ts.Tensor) *ts.Tensor {
	return x.MustDetach(false).MustSetRequiresGrad(true, true)
}

func maxDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

func maxAbs(a []float64) float64 {
	m := 0.0
	for _, x := range a {
		m = max(m, math.Abs(x))
	}
	return m
}
