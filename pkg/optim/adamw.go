package optim

import (
	"math"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// AdamW is decoupled-weight-decay Adam over a model's parameters, written over tensors so that its
// state can be checkpointed (gotch wraps libtorch's C++ optimizer, whose moments cannot be saved).
// When a parameter is not float32 (bfloat16 on CUDA), AdamW keeps a float32 master copy and updates
// that: at lr 1e-6 a bfloat16 weight cannot absorb the update.
//
// With Offload the state lives in host memory whatever the parameters' device: moments and a float32
// master copy of every parameter (float32 ones too: the step runs on the host) are CPU tensors; each
// step copies a parameter's gradient to the host, updates the master there and copies it back into
// the parameter (cast to its dtype). On a CPU-only machine the copies are host to host and the
// arithmetic is the same as without offload.
//
//	m ← β1·m + (1−β1)·g          v ← β2·v + (1−β2)·g²
//	θ ← θ − lr·wd·θ − lr · (m / (1−β1^t)) / (√(v / (1−β2^t)) + ε)
type AdamW struct {
	AdamWOptions
	Params []*ts.Tensor
	Names  []string
	Step   int          // optimizer steps taken
	M, V   []*ts.Tensor // first and second moments, float32
	Master []*ts.Tensor // float32 master weights (nil entries for float32 parameters)
}

// AdamWOptions are AdamW's hyperparameters.
type AdamWOptions struct {
	LR          float64 // base learning rate; the step's rate is LR × warm-up factor
	Beta1       float64
	Beta2       float64
	Eps         float64
	WeightDecay float64
	WarmupSteps int  // linear learning-rate warm-up, in optimizer steps
	Offload     bool // keep the state in host memory and step there (models[].optim.offload: cpu)
}

// NewAdamW creates the optimizer state for params (call on the torch thread).
func NewAdamW(names []string, params []*ts.Tensor, opt AdamWOptions) *AdamW {
	o := &AdamW{AdamWOptions: opt, Params: params, Names: names}
	_ = torch.Untracked(func() error {
		return torch.NoGrad(func() error {
			for _, p := range params {
				dev := p.MustDevice()
				if opt.Offload {
					dev = gotch.CPU
				}
				o.M = append(o.M, ts.MustZeros(p.MustSize(), gotch.Float, dev))
				o.V = append(o.V, ts.MustZeros(p.MustSize(), gotch.Float, dev))
				switch {
				case opt.Offload: // a host copy of its own, even of a float32 parameter on the CPU
					w := ts.MustEmpty(p.MustSize(), gotch.Float, gotch.CPU)
					w.Copy_(p)
					o.Master = append(o.Master, w)
				case p.DType() != gotch.Float:
					o.Master = append(o.Master, p.MustTotype(gotch.Float, false).MustDetach(true))
				default:
					o.Master = append(o.Master, nil)
				}
			}
			return nil
		})
	})
	return o
}

// CurrentLR is the learning rate of the next step (linear warm-up over WarmupSteps).
func (o *AdamW) CurrentLR() float64 {
	if o.WarmupSteps > 0 && o.Step < o.WarmupSteps {
		return o.LR * float64(o.Step+1) / float64(o.WarmupSteps)
	}
	return o.LR
}

// Apply takes one step with the parameters' current gradients (which the caller has clipped) at the
// given learning rate. Parameters without a gradient are skipped.
func (o *AdamW) Apply(lr float64) {
	o.Step++
	bc1 := 1 - math.Pow(o.Beta1, float64(o.Step))
	bc2 := 1 - math.Pow(o.Beta2, float64(o.Step))
	_ = torch.NoGrad(func() error {
		for i := range o.Params {
			o.update(i, lr, bc1, bc2)
		}
		return nil
	})
}

// update applies the step to parameter i, in a scope of its own: its temporaries (g², the
// denominator; g in float32 for a half parameter) are freed before the next parameter's, so a step
// needs one parameter's scratch on top of the weights, gradients and moments, not one per parameter.
func (o *AdamW) update(i int, lr, bc1, bc2 float64) {
	s := torch.NewScope()
	defer s.Close()
	p := o.Params[i]
	g := p.MustGrad(false)
	if !g.MustDefined() {
		return
	}
	if o.Offload {
		g = g.MustTo(gotch.CPU, false) // a no-op for a CPU gradient, which the step only reads
	}
	if g.DType() != gotch.Float {
		g = g.MustTotype(gotch.Float, false)
	}
	w := p
	if o.Master[i] != nil {
		w = o.Master[i]
	}
	m, v := o.M[i], o.V[i]
	// Fused where libtorch has the op, every pass over the parameter counted (a step of a 32M-parameter
	// model is bound by memory traffic): m ← m + (1−β₁)(g − m), v ← v + (1−β₂)(g² − v).
	m.MustLerp_(g, ts.FloatScalar(1-o.Beta1))
	v.MustLerp_(g.MustSquare(false), ts.FloatScalar(1-o.Beta2))
	if lr == 0 {
		return
	}
	if o.WeightDecay > 0 {
		w.MustMulScalar_(ts.FloatScalar(1 - lr*o.WeightDecay))
	}
	// θ ← θ + m / d with d = −(√(v/(1−β₂^t)) + ε) · (1−β₁^t)/lr: the step size folded into the denominator.
	d := v.MustDivScalar(ts.FloatScalar(bc2), false)
	d.MustSqrt_()
	d.MustAddScalar_(ts.FloatScalar(o.Eps))
	d.MustMulScalar_(ts.FloatScalar(-bc1 / lr))
	w.MustAddcdiv_(m, d)
	if o.Master[i] != nil {
		p.Copy_(w) // cast to the parameter's dtype and, offloaded, copied to its device
	}
}

// Device is where the optimizer state lives (the CPU when offloaded; the CPU when it holds none).
func (o *AdamW) Device() gotch.Device {
	if len(o.M) == 0 {
		return gotch.CPU
	}
	return o.M[0].MustDevice()
}

// SavedMaster reports whether parameter i's master copy is part of the saved state: a half
// parameter's is (its weights cannot be rebuilt from the parameter); an offloaded float32
// parameter's host copy equals the parameter and is rebuilt from it, so a checkpoint's format does
// not depend on offload.
func (o *AdamW) SavedMaster(i int) bool {
	return o.Master[i] != nil && o.Params[i].DType() != gotch.Float
}

// SyncMaster copies the parameters into their master copies: after something other than this
// optimizer changed the weights (the format warm-up's own optimizer), the next step must start from
// them, not from the master copies made before. Torch thread.
func (o *AdamW) SyncMaster() {
	_ = torch.NoGrad(func() error {
		for i, w := range o.Master {
			if w != nil {
				w.Copy_(o.Params[i])
			}
		}
		return nil
	})
}

// Free releases the optimizer state (a warm-up optimizer that is done).
func (o *AdamW) Free() {
	for _, state := range [][]*ts.Tensor{o.M, o.V, o.Master} {
		for _, t := range state {
			if t != nil {
				t.MustDrop()
			}
		}
	}
	o.M, o.V, o.Master = nil, nil, nil
}
