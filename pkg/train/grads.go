package train

import (
	"math"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/torch"
)

// ZeroGrad zeroes the gradients of all parameters.
func ZeroGrad(params []*ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	for _, p := range params {
		p.ZeroGrad()
	}
}

// GradNorm returns the total L2 norm of the parameters' gradients (non-finite if any gradient is).
func GradNorm(params []*ts.Tensor) float64 { return math.Sqrt(gradSquares(params)) }

// gradSquares is the sum of the squares of the parameters' gradients, in float64 (undefined and
// released gradients count zero).
func gradSquares(params []*ts.Tensor) float64 {
	return squares(params, func(_ int, g *ts.Tensor) *ts.Tensor { return g.MustTotype(gotch.Float, false) })
}

// squares is Σ‖f(i, gᵢ)‖² over the parameters' defined, non-empty gradients gᵢ, summed in float64.
func squares(params []*ts.Tensor, f func(i int, g *ts.Tensor) *ts.Tensor) float64 {
	s := torch.NewScope()
	defer s.Close()
	total := 0.0
	_ = torch.NoGrad(func() error {
		var acc *ts.Tensor
		for i, p := range params {
			g := p.MustGrad(false)
			if !g.MustDefined() || g.Numel() == 0 {
				continue
			}
			sq := f(i, g).MustSquare(true).MustSum(gotch.Double, true)
			if acc == nil {
				acc = sq
			} else {
				acc = acc.MustAdd(sq, false)
			}
		}
		if acc != nil {
			total = acc.Float64Values()[0]
		}
		return nil
	})
	return total
}

// ScaleGrads multiplies every gradient by f (gradient clipping).
func ScaleGrads(params []*ts.Tensor, f float64) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for _, p := range params {
			if g := p.MustGrad(false); g.MustDefined() {
				g.MustMulScalar_(ts.FloatScalar(f))
			}
		}
		return nil
	})
}

// snapshotGrads copies the current gradients (freed by dropAll).
func snapshotGrads(params []*ts.Tensor) []*ts.Tensor {
	out := make([]*ts.Tensor, len(params))
	_ = torch.Untracked(func() error {
		return torch.NoGrad(func() error {
			for i, p := range params {
				g := p.MustGrad(false)
				out[i] = g.MustDetachCopy(false)
				g.MustDrop()
			}
			return nil
		})
	})
	return out
}

func dropAll(ts []*ts.Tensor) {
	for _, t := range ts {
		if t != nil {
			t.MustDrop()
		}
	}
}

// gradDiffNorm is the L2 norm of (current gradient − prev), prev nil meaning zero: the gradient norm
// of the share of the loss accumulated since prev was taken.
func gradDiffNorm(params []*ts.Tensor, prev []*ts.Tensor) float64 {
	if prev == nil {
		return GradNorm(params)
	}
	return math.Sqrt(squares(params, func(i int, g *ts.Tensor) *ts.Tensor {
		return g.MustSub(prev[i], false).MustTotype(gotch.Float, true)
	}))
}

// clippedStep is the tail of every optimizer step, in training and in the format warm-up: the
// gradients scaled to total norm clip when their pre-clip norm is above it (clip 0: off), then the
// step (AdamW at its current learning rate; sharded, each rank its partition and the weights shared).
func clippedStep(params []*ts.Tensor, norm, clip float64, step func() error) error {
	if clip > 0 && norm > clip {
		ScaleGrads(params, clip/(norm+1e-6))
	}
	return step()
}

// adamwStep is opt's step at its current learning rate, for clippedStep.
func adamwStep(opt *optim.AdamW) func() error {
	return func() error {
		opt.Apply(opt.CurrentLR())
		return nil
	}
}

// addGrads adds the parameters' gradients into acc.
func addGrads(acc []*ts.Tensor, params []*ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for i, p := range params {
			acc[i].MustAdd_(p.MustGrad(false))
		}
		return nil
	})
}

// setGrads copies src into the parameters' gradients.
func setGrads(params []*ts.Tensor, src []*ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for i, p := range params {
			p.MustGrad(false).Copy_(src[i])
		}
		return nil
	})
}
