package policy

import (
	"math"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// rope holds the rotary-embedding tables cos and sin [n, head_dim] for positions 0…n−1, in the
// weights' dtype, computed as transformers does (inverse frequencies in float32, angle = position ·
// inv_freq, emb = cat(angle, angle)) and grown on demand. sin's first half is negated, which turns
// HF's rotate_half(x)·sin into roll(x, d/2)·sin.
type rope struct {
	invFreq  []float64 // as float32 values (float64 for float64 models)
	n        int64
	cos, sin *ts.Tensor
}

func newRope(c arch.Config, dt gotch.DType) *rope {
	d := c.HeadDim
	inv := make([]float64, d/2)
	for i := range inv {
		if dt == gotch.Double {
			inv[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(d))
		} else { // torch: 1.0 / (base ** (arange(0, d, 2).float() / d)) in float32
			e := float32(2*i) / float32(d)
			inv[i] = float64(1 / float32(math.Pow(c.RopeTheta, float64(e))))
		}
	}
	switch c.RopeScaling.Kind() {
	case "linear":
		for i := range inv {
			inv[i] /= c.RopeScaling.Factor
		}
	case "llama3":
		r := c.RopeScaling
		oldLen := float64(r.OriginalMaxPositionEmbeddings)
		lowWave, highWave := oldLen/r.LowFreqFactor, oldLen/r.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave: // high frequency: unchanged
			case wave > lowWave:
				inv[i] = f / r.Factor
			default:
				smooth := (oldLen/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				inv[i] = (1-smooth)*f/r.Factor + smooth*f
			}
		}
	}
	if dt != gotch.Double {
		for i := range inv {
			inv[i] = float64(float32(inv[i]))
		}
	}
	return &rope{invFreq: inv}
}

// lookup returns cos and sin [B, 1, T, head_dim] for positions [B, T] (or [1, T]). maxPos bounds
// the positions; when it is negative the positions are read back to find it.
func (r *rope) lookup(m *Model, positions *ts.Tensor, maxPos int64) (cos, sin *ts.Tensor) {
	size := positions.MustSize()
	if maxPos < 0 {
		t := positions.MustMax(false)
		maxPos = t.Int64Values()[0]
		t.MustDrop()
	}
	r.ensure(m, maxPos+1)
	flat := positions.MustFlatten(0, -1, false)
	shape := []int64{size[0], 1, size[1], int64(len(r.invFreq) * 2)}
	cos = r.cos.MustIndexSelect(0, flat, false).MustView(shape, true)
	sin = r.sin.MustIndexSelect(0, flat, false).MustView(shape, true)
	flat.MustDrop()
	return cos, sin
}

// ensure grows the tables to cover positions 0…need−1.
func (r *rope) ensure(m *Model, need int64) {
	if need <= r.n {
		return
	}
	n := max(int64(256), r.n)
	for n < need {
		n *= 2
	}
	r.build(m, n)
}

// build computes the tables for n positions, outside any scope (the model owns them).
func (r *rope) build(m *Model, n int64) {
	calc := gotch.Float
	if m.dtype == gotch.Double {
		calc = gotch.Double
	}
	_ = torch.Untracked(func() error {
		s := torch.NewScope()
		defer s.Close()
		inv := ts.MustOfSlice(r.invFreq).MustTotype(calc, true).MustTo(m.device, true)
		pos := ts.MustArange(ts.IntScalar(n), calc, m.device)
		angle := pos.MustOuter(inv, false)
		emb := ts.MustCat([]*ts.Tensor{angle, angle}, 1)
		cos := emb.MustCos(false).MustTotype(m.dtype, true)
		half := int64(len(r.invFreq))
		sin := emb.MustSin(false)
		signed := ts.MustCat([]*ts.Tensor{sin.MustNarrow(1, 0, half, false).MustNeg(true), sin.MustNarrow(1, half, half, false)}, 1).MustTotype(m.dtype, true)
		s.Keep(cos, signed)
		if r.cos != nil {
			r.cos.MustDrop()
			r.sin.MustDrop()
		}
		r.cos, r.sin, r.n = cos, signed, n
		return nil
	})
}
