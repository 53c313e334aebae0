package policy

import (
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// A model whose weights are sharded among processes (pkg/train's dist.shard: parameters) holds its
// weights in units: each decoder layer (units 0 … L−1) and the root (unit L: the embeddings, the
// final norm and lm_head). Outside the passes that use them, a unit's tensors hold no data; the
// model asks its Units to make a unit whole just before its forward or its backward and lets it go
// right after, and hands each unit's gradients over as the backward leaves it.

// Pass is the kind of a pass over a model's units.
type Pass int

// The passes.
const (
	PassForward  Pass = iota // a forward with no backward to follow: generation, scoring, saving
	PassTrain                // a training forward (TrainScore); its backward follows
	PassBackward             // a training backward (Backprop.Backward)
)

// Units is the hook through which a model whose weights are sharded makes each unit whole around
// its use. In every pass the model calls, on the torch thread and with nothing else running on it
// between Begin and End:
//
//	PassForward, PassTrain  Begin; Gather(root); per layer i in order: Gather(i) … Release(i); End.
//	                        A forward releases the root before End; a training forward keeps it whole
//	                        for its backward.
//	PassBackward            Begin; per layer i from the last: Gather(i) … Reduce(i), Release(i);
//	                        Reduce(root), Release(root); End.
//
// Reduce says the backward has left the unit: the gradients of its weights on this process are
// complete for the pass (the strategy reduces them into its shards and frees them). A backward
// recomputes each layer (gradient checkpointing) whatever the model's setting: a forward's graph
// would hold the gathered weights until the backward.
type Units interface {
	Begin(p Pass)
	Gather(unit int)
	Release(unit int)
	Reduce(unit int)
	End()
	// Whole says whether every unit is whole here for now (held): passes then gather nothing, and
	// generation may pack the CPU decoding layout.
	Whole() bool
	// Hold is called when generation holds the decoding layout over a phase whose weights do not
	// change (HoldDecodingLayout; from any goroutine but the torch thread): the strategy may keep
	// every unit whole until the returned release (dist.rollout_gather: model).
	Hold() (release func())
}

// unitHook holds a model's Units; the model's views (adapters, the decoding layout) share it.
type unitHook struct{ u Units }

// SetUnits makes u the model's Units (nil: the weights are whole again): from now on its passes
// gather and release units through u. Its adapted views share it.
func (m *Model) SetUnits(u Units) { m.Base().hook.u = u }

// units is the model's Units, nil when its weights are whole.
func (m *Model) units() Units {
	if m.hook == nil {
		return nil
	}
	return m.hook.u
}

// RootUnit is the index of the root unit (the embeddings, the final norm, lm_head): the number of
// decoder layers.
func (m *Model) RootUnit() int { return len(m.Base().Layers) }

// UnitParams lists the base model's weights by unit: each decoder layer's, then the root's
// (model.embed_tokens, model.norm, lm_head unless tied), each in checkpoint order.
func (m *Model) UnitParams() [][]Param {
	var out [][]Param
	for _, ss := range m.Base().unitSlots() {
		var ps []Param
		for _, s := range ss {
			ps = append(ps, Param{Name: s.name, T: *s.ptr})
		}
		out = append(out, ps)
	}
	return out
}

// unitSlots is slots by unit: the layers', then the root's.
func (m *Model) unitSlots() [][]slot {
	out := make([][]slot, len(m.Layers)+1)
	for i, l := range m.Layers {
		collect(fmt.Sprintf("model.layers.%d.", i), l, &out[i])
	}
	root := len(m.Layers)
	for _, s := range m.slots() {
		if !isLayerSlot(s.name) {
			out[root] = append(out[root], s)
		}
	}
	return out
}

func isLayerSlot(name string) bool {
	var i int
	var rest string
	n, _ := fmt.Sscanf(name, "model.layers.%d.%s", &i, &rest)
	return n == 2
}

// forwardPass starts a forward over a sharded model (PassForward) with its root gathered; end
// releases the root and ends the pass. Nothing for a model whose weights are whole.
func (m *Model) forwardPass() (end func()) {
	u := m.units()
	if u == nil {
		return func() {}
	}
	root := m.RootUnit()
	u.Begin(PassForward)
	u.Gather(root)
	return func() {
		u.Release(root)
		u.End()
	}
}

// gather and release bracket layer i's use in a pass (nothing when the weights are whole).
func (m *Model) gather(i int) {
	if u := m.units(); u != nil {
		u.Gather(i)
	}
}

func (m *Model) release(i int) {
	if u := m.units(); u != nil {
		u.Release(i)
	}
}

// holdUnits lets the model's Units keep it whole while its decoding layout is held.
func (m *Model) holdUnits() (release func()) {
	if u := m.units(); u != nil {
		return u.Hold()
	}
	return func() {}
}

// split says whether generation must run on the model's units one at a time (sharded and not held
// whole): then it keeps the checkpoint layout instead of packing a copy of the weights.
func (m *Model) split() bool {
	u := m.units()
	return u != nil && !u.Whole()
}

// runLayers runs the decoder layers on the stream x (consumed), each gathered around its forward,
// and returns the last one's output.
func (m *Model) runLayers(x *ts.Tensor, p *pass) *ts.Tensor {
	for i, l := range m.Layers {
		p.layer = i
		m.gather(i)
		x = step(x, func(x *ts.Tensor) *ts.Tensor { return forwardLayer(l, x, p) })
		m.release(i)
	}
	return x
}

// unitStream walks a sharded model's tensors in checkpoint order (the root's embeddings, the
// layers in order, the root's norm and head: a forward pass's order) with the unit of the tensor
// at hand gathered, one layer at a time. The zero stream (weights whole) does nothing.
type unitStream struct {
	m    *Model
	of   map[string]int // tensor name → unit
	cur  int            // the layer gathered now, −1: none
	done func()
}

// unitStream starts a forward pass for a walk over the tensors (end it with end).
func (m *Model) unitStream() *unitStream {
	if m.units() == nil {
		return &unitStream{cur: -1}
	}
	st := &unitStream{m: m, of: map[string]int{}, cur: -1}
	for u, ss := range m.unitSlots() {
		for _, s := range ss {
			st.of[s.name] = u
		}
	}
	st.done = m.forwardPass()
	return st
}

// reach gathers the layer of the named tensor (releasing the one before); the root is whole
// throughout the pass.
func (st *unitStream) reach(name string) {
	if st.m == nil {
		return
	}
	u := st.of[name]
	if u == st.m.RootUnit() || u == st.cur {
		return
	}
	if st.cur >= 0 {
		st.m.release(st.cur)
	}
	st.m.gather(u)
	st.cur = u
}

// end releases what the walk holds and ends its pass (the pass's remaining gathers are done by
// its End when the walk stopped short).
func (st *unitStream) end() {
	if st.m == nil {
		return
	}
	if st.cur >= 0 {
		st.m.release(st.cur)
	}
	st.done()
}

// Shell is a model of m's configuration, dtype and device whose weights hold no data: the frame of
// a sharded copy (pkg/train's KL reference under dist.shard: parameters) whose Units fill it.
func (m *Model) Shell() (*Model, error) {
	b := m.Base()
	c := skeleton(b.Config, b.device, b.dtype)
	err := c.build(func(s slot) (*ts.Tensor, error) { return ts.MustEmpty([]int64{0}, b.dtype, gotch.CPU), nil })
	return c, err
}
