package policy

import (
	"github.com/sugarme/gotch/ts"
)

// packed holds the CPU decoding layout of a model's projections: q/k/v fused into one matrix and
// gate/up into another, every matrix stored transposed ([in, out], contiguous). A decoding step
// multiplies a few rows by each matrix, and OpenBLAS runs x·W with W in that layout two to three
// times faster than x·Wᵀ from the checkpoint layout (measured for 16 rows × 512 × 2048: 31 vs 9.5
// GFLOP/s on two cores). Generation builds it once per batch (one copy of the weights, freed with
// the batch), so it always reflects the current weights; CUDA keeps the checkpoint layout, which
// cuBLAS handles at full speed either way.
type packed struct {
	layers []packedLayer
	head   *ts.Tensor // lm_head.weightᵀ [hidden, vocab]
}

type packedLayer struct {
	qkv, o, gateUp, down packedLinear
}

// packedLinear is y = x·wt + b.
type packedLinear struct {
	wt, b *ts.Tensor
}

func (l packedLinear) forward(x *ts.Tensor) *ts.Tensor {
	y := x.MustMatmul(l.wt, false)
	if l.b != nil {
		y = y.MustAdd(l.b, true)
	}
	return y
}

// packLinear fuses layers that read the same input into one [in, Σout] matrix.
func packLinear(ls ...Linear) packedLinear {
	var ws, bs []*ts.Tensor
	for _, l := range ls {
		ws = append(ws, l.Weight)
		if l.Bias != nil {
			bs = append(bs, l.Bias)
		}
	}
	w := ws[0]
	if len(ws) > 1 {
		w = ts.MustCat(ws, 0)
	}
	p := packedLinear{wt: w.MustT(false).MustContiguous(true).MustDetach(true)}
	if len(bs) == len(ls) {
		b := bs[0]
		if len(bs) > 1 {
			b = ts.MustCat(bs, 0)
		}
		p.b = b.MustDetach(false)
	}
	return p
}

// pack builds the decoding layout of m's current weights, in the current torch scope.
func (m *Model) pack() *packed {
	p := &packed{head: m.LMHead.MustT(false).MustContiguous(true).MustDetach(true)}
	for _, l := range m.Layers {
		a := &l.SelfAttn
		p.layers = append(p.layers, packedLayer{
			qkv:    packLinear(a.QProj, a.KProj, a.VProj),
			o:      packLinear(a.OProj),
			gateUp: packLinear(l.MLP.GateProj, l.MLP.UpProj),
			down:   packLinear(l.MLP.DownProj),
		})
	}
	return p
}

// mlp is MLP.forward on the packed layout: down(silu(gate) · up) with gate and up from one product.
func (l *packedLayer) mlp(x *ts.Tensor, inter int64) *ts.Tensor {
	gu := l.gateUp.forward(x)
	up := gu.MustNarrow(-1, inter, inter, false)
	h := gu.MustNarrow(-1, 0, inter, false).MustSilu(true).MustMul(up, true)
	up.MustDrop()
	gu.MustDrop()
	out := l.down.forward(h)
	h.MustDrop()
	return out
}
