package policy

import "github.com/sugarme/gotch/ts"

// gemmaNorm is Gemma's RMSNorm (arch.Options.OffsetNorm): x / sqrt(mean(x²) + ε) · (1 + w), all in float32 (float64 for a
// float64 model) and cast back at the end. Its weight starts at zero.
type gemmaNorm struct {
	Weight *ts.Tensor // weight [dim]
	dim    int64
}

// scalarOne is the 1 of (1 + w).
var scalarOne = ts.FloatScalar(1)

func (n *gemmaNorm) weights(prefix string, out *[]slot) {
	*out = append(*out, slot{prefix + "weight", []int64{n.dim}, initZeros, &n.Weight})
}

func (n *gemmaNorm) forward(x *ts.Tensor, p *pass) *ts.Tensor {
	w := cast(n.Weight, p.m.compute).MustAddScalar(scalarOne, false)
	return cast(rms(x, p.m).MustMul(w, true), x.DType())
}
