package torch

import (
	"slices"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// DefineGrads gives every parameter a zero gradient when some have none: before a model's first
// backward, after sharding released them, or when every call of a mini-batch carried no signal
// (pkg/train's withSignal) so that no backward ran. The gradient of 0·Σp is zero, so the values are those of
// zeroed gradients; the step's snapshots, collectives and optimizer then see a gradient everywhere.
func DefineGrads(params []*ts.Tensor) {
	s := NewScope()
	defer s.Close()
	if !slices.ContainsFunc(params, func(p *ts.Tensor) bool { return !p.MustGrad(false).MustDefined() }) {
		return
	}
	var zero *ts.Tensor
	for _, p := range params {
		z := p.MustSum(gotch.Double, false).MustMulScalar(ts.FloatScalar(0), true)
		if zero == nil {
			zero = z
		} else {
			zero = zero.MustAdd(z, true)
		}
	}
	zero.MustBackward()
}
