package policy

import (
	"sync"

	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch/ts"
)

// pack returns m in the CPU decoding layout: the same model sharing m's weights, with every
// projection also stored transposed ([in, out], contiguous) and the projections that read the same
// input fused into one matrix (q/k/v, gate/up). A decoding step multiplies a few rows by each
// matrix, and OpenBLAS runs x·W with W in that layout two to three times faster than x·Wᵀ from the
// checkpoint layout (measured for 16 rows × 512 × 2048: 31 vs 9.5 GFLOP/s on two cores).
// Generation packs once per batch, in its torch scope (one copy of the weights, freed with the
// batch), so the copy always reflects the current weights — unless the policy holds the layout
// (HoldDecodingLayout) over a phase whose weights do not change. CUDA keeps the checkpoint layout,
// which cuBLAS handles at full speed either way. m itself is not changed.
func (m *Model) pack() *Model {
	p := *m
	p.Layers = make([]layer, len(m.Layers))
	for i, l := range m.Layers {
		p.Layers[i] = l.packed()
	}
	p.head = packLinear(&m.head)
	return &p
}

// packLinear is the CPU decoding layout of layers that read the same input: one Linear whose wt is
// [in, Σout] (and whose bias is the biases' concatenation, when they all have one).
func packLinear(ls ...*Linear) Linear {
	var ws, bs []*ts.Tensor
	p := Linear{Weight: ls[0].Weight, in: ls[0].in}
	for _, l := range ls {
		ws = append(ws, l.Weight)
		if l.Bias != nil {
			bs = append(bs, l.Bias)
		}
		p.out += l.out
	}
	w := ws[0]
	if len(ws) > 1 {
		w = ts.MustCat(ws, 0)
	}
	p.wt = w.MustT(false).MustContiguous(true).MustDetach(true)
	if len(bs) == len(ls) {
		b := bs[0]
		if len(bs) > 1 {
			b = ts.MustCat(bs, 0)
		}
		p.Bias, p.bias = b.MustDetach(false), true
	}
	return p
}

// heldLayout is a policy's packed model kept from one generation batch to the next, with the scope
// that owns its tensors.
type heldLayout struct {
	holds int    // the holds not yet released: the layout is kept while there is one
	of    *Model // the model it was packed from
	model *Model
	scope *torch.Scope
}

// HoldDecodingLayout makes generation keep the CPU decoding layout (see pack) from one batch to the
// next instead of rebuilding it for each: a copy of the weights, which for a 1B model on CPU takes
// longer than the decoding steps of a call. The weights must not change while it is held: hold it
// over a phase that only generates (a rollout, a served model between reloads) and call the returned
// release — or DropDecodingLayout after changing the weights in place — before reading them again.
// Does nothing on CUDA. Call it from any goroutine but the torch thread, while nothing generates.
//
// An adapter's policy (NewAdapterPolicy) holds its base policy's layout: one copy for the base and
// all its adapters. Holds nest: the layout is kept until the last one is released (each release
// counts once), so the base and its adapters can be held and released in any order.
//
// A model whose weights are sharded (units.go) is offered to its Units to hold whole meanwhile; when
// they do not, generation runs unit by unit in the checkpoint layout and packs nothing.
func (p *Policy) HoldDecodingLayout() (release func()) {
	if p.layoutOf != nil {
		return p.layoutOf.HoldDecodingLayout()
	}
	whole := p.Model.holdUnits()
	p.layout.holds++
	var once sync.Once
	return func() {
		once.Do(func() {
			if p.layout.holds--; p.layout.holds == 0 {
				p.DropDecodingLayout()
			}
			whole()
		})
	}
}

// DropDecodingLayout frees a held decoding layout; the next batch packs the current weights anew
// (and keeps them, if the layout is still held). Call it from any goroutine but the torch thread.
func (p *Policy) DropDecodingLayout() {
	if p.layoutOf != nil {
		p.layoutOf.DropDecodingLayout()
		return
	}
	if p.layout.scope == nil {
		return
	}
	_ = torch.Do(func() error {
		p.layout.scope.Close()
		return nil
	})
	p.layout.of, p.layout.model, p.layout.scope = nil, nil, nil
}

// decodingModel is m as generation runs it: on CPU the packed layout — the held one when the policy
// holds it, else a copy made in the current scope (freed with the batch). Torch thread.
func (p *Policy) decodingModel(m *Model) *Model {
	if m.device.IsCuda() || m.split() {
		return m
	}
	if p.layoutOf != nil && p.layoutOf.Model.Base() == m {
		return p.layoutOf.decodingModel(m)
	}
	if p.layout.holds == 0 {
		return m.pack()
	}
	if p.layout.of != m {
		if p.layout.scope != nil {
			p.layout.scope.Close()
		}
		_ = torch.Untracked(func() error { // a scope of its own, outside the batch's
			p.layout.scope = torch.NewScope()
			p.layout.of, p.layout.model = m, m.pack()
			return nil
		})
	}
	return p.layout.model
}
