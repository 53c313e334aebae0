package policy

// Adapted views of a base and the forward pass's low-rank terms: a forward call chooses an adapter
// per row (or none), and the terms of all rows are computed at once (multi-LoRA batching).

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// loraMix is an adapted model's choice of adapters: row i of a forward call runs on
// adapters[rows[i]], on the base alone where rows[i] < 0; rows nil puts every row on adapters[0].
type loraMix struct {
	root     *Model // the base (no adapters)
	adapters []*Adapter
	rows     []int
}

// WithAdapter is m with every row on adapter a: a view sharing m's weights whose Forward, Score,
// TrainScore and generation add a's low-rank terms and whose Parameters are a's. Torch thread not
// needed.
func (m *Model) WithAdapter(a *Adapter) (*Model, error) { return m.WithAdapters([]*Adapter{a}, nil) }

// WithAdapters is m with a per-row adapter choice (multi-LoRA batching): row i of each forward
// call on the view runs on adapters[rows[i]], on the base alone where rows[i] is −1; rows nil puts
// every row on adapters[0] (any batch size). Calls on the view must then have len(rows) rows. The
// adapters must have been made for m's architecture. A view copies the base's constants (rotary
// tables, rms_norm_eps): after a Reload of the base, make its views again (generation makes its
// own per batch).
func (m *Model) WithAdapters(adapters []*Adapter, rows []int) (*Model, error) {
	root := m.Base()
	layout, err := root.projLayout()
	if err != nil {
		return nil, err
	}
	for _, a := range adapters {
		if a == nil {
			return nil, errors.New("WithAdapters: nil adapter")
		}
		if !sameLayout(a.layout, layout) || a.vocab != root.opts.Vocab {
			return nil, fmt.Errorf("adapter %s: made for %s and a vocabulary of %d, the base has %s and %d",
				a.Name, layoutString(a.layout), a.vocab, layoutString(layout), root.opts.Vocab)
		}
		if a.device != root.device {
			return nil, fmt.Errorf("adapter %s: on %v, the base on %v", a.Name, a.device, root.device)
		}
	}
	if rows == nil && len(adapters) == 0 {
		return root, nil
	}
	for i, r := range rows {
		if r < -1 || r >= len(adapters) {
			return nil, fmt.Errorf("WithAdapters: row %d: adapter %d of %d", i, r, len(adapters))
		}
	}
	v := *root
	v.lora = &loraMix{root: root, adapters: adapters, rows: rows}
	return &v, nil
}

// Base is the model without adapters: m itself unless m is an adapted view.
func (m *Model) Base() *Model {
	if m.lora != nil {
		return m.lora.root
	}
	return m
}

// Adapter is the adapter of a view made by WithAdapter (every row on one adapter); nil otherwise.
func (m *Model) Adapter() *Adapter {
	if m.lora != nil && m.lora.rows == nil && len(m.lora.adapters) == 1 {
		return m.lora.adapters[0]
	}
	return nil
}

// withRows is m's view for the rows [lo, hi) of its choice (for micro-batches).
func (m *Model) withRows(lo, hi int) *Model {
	if m.lora == nil || m.lora.rows == nil {
		return m
	}
	v := *m
	mix := *m.lora
	mix.rows = m.lora.rows[lo:hi]
	v.lora = &mix
	return &v
}

// loraPass is a forward call's adapter state: which adapter each row uses.
type loraPass struct {
	mix     *loraMix
	uniform int        // ≥ 0: every row uses adapters[uniform]
	idx     *ts.Tensor // otherwise: [B] int64, each row's slot in the stacked weights (len(adapters): none)
	used    []int      // otherwise: the adapters the rows use, in order
}

// newLoraPass prepares the adapter state of a forward call of B rows; nil when no row has an adapter.
func newLoraPass(mix *loraMix, B int64, dev gotch.Device) *loraPass {
	if mix == nil {
		return nil
	}
	if mix.rows == nil {
		return &loraPass{mix: mix, uniform: 0}
	}
	if int64(len(mix.rows)) != B {
		panic(fmt.Sprintf("policy: a forward call of %d rows on a view with an adapter choice for %d", B, len(mix.rows)))
	}
	first, same := mix.rows[0], true
	for _, r := range mix.rows {
		same = same && r == first
	}
	if same {
		if first < 0 {
			return nil
		}
		return &loraPass{mix: mix, uniform: first}
	}
	lp := &loraPass{mix: mix, uniform: -1}
	slot := map[int]int64{}
	for _, r := range mix.rows {
		if _, ok := slot[r]; r >= 0 && !ok {
			slot[r] = int64(len(lp.used))
			lp.used = append(lp.used, r)
		}
	}
	idx := make([]int64, B)
	for i, r := range mix.rows {
		idx[i] = int64(len(lp.used)) // the zero slot
		if r >= 0 {
			idx[i] = slot[r]
		}
	}
	lp.idx = ts.MustOfSlice(idx).MustTo(dev, true)
	return lp
}

// delta is the low-rank term of projection proj of layer for the rows' adapters, [B, T, out] in
// x's dtype, or nil when no row's adapter targets it. x is the projection's input [B, T, in].
func (lp *loraPass) delta(layer, proj int, x *ts.Tensor) *ts.Tensor {
	if lp == nil {
		return nil
	}
	dt := x.DType()
	if lp.uniform >= 0 {
		a := lp.mix.adapters[lp.uniform]
		A, B := a.a[layer][proj], a.b[layer][proj]
		if A == nil {
			return nil
		}
		h := ts.MustLinear(x, cast(A, dt), ts.None)
		return ts.MustLinear(h, cast(B, dt), ts.None).MustMulScalar(ts.FloatScalar(a.Config.Scale()), true)
	}
	// Mixed rows: stack the used adapters' A [r, in] and scale·B [out, r] (padded to the largest
	// rank with zeros, which add nothing), plus a zero slot for rows on no adapter, and gather
	// each row's.
	var rmax int64
	found := false
	for _, i := range lp.used {
		if a := lp.mix.adapters[i]; a.a[layer][proj] != nil {
			rmax, found = max(rmax, int64(a.Config.Rank)), true
		}
	}
	if !found {
		return nil
	}
	shape := lp.mix.adapters[lp.used[0]].layout[layer][proj]
	in, out := shape.in, shape.out
	var as, bs []*ts.Tensor
	for _, i := range lp.used {
		a := lp.mix.adapters[i]
		A, B := a.a[layer][proj], a.b[layer][proj]
		if A == nil {
			as = append(as, ts.MustZeros([]int64{rmax, in}, dt, x.MustDevice()))
			bs = append(bs, ts.MustZeros([]int64{out, rmax}, dt, x.MustDevice()))
			continue
		}
		A, B = cast(A, dt), cast(B, dt).MustMulScalar(ts.FloatScalar(a.Config.Scale()), false)
		if r := int64(a.Config.Rank); r < rmax {
			A = A.MustConstantPadNdWithVal([]int64{0, 0, 0, rmax - r}, ts.FloatScalar(0), false)
			B = B.MustConstantPadNdWithVal([]int64{0, rmax - r}, ts.FloatScalar(0), true)
		}
		as, bs = append(as, A), append(bs, B)
	}
	as = append(as, ts.MustZeros([]int64{rmax, in}, dt, x.MustDevice()))
	bs = append(bs, ts.MustZeros([]int64{out, rmax}, dt, x.MustDevice()))
	rowA := ts.MustStack(as, 0).MustIndexSelect(0, lp.idx, true) // [B, rmax, in]
	rowB := ts.MustStack(bs, 0).MustIndexSelect(0, lp.idx, true) // [B, out, rmax]
	h := x.MustMatmul(rowA.MustTranspose(1, 2, true), false)     // [B, T, rmax]
	return h.MustMatmul(rowB.MustTranspose(1, 2, true), true)    // [B, T, out]
}

// outer is the low-rank term of embed_tokens or lm_head (proj) for the entries of a forward call,
// or nil when no entry's adapter targets it. first(A) is the input's product with an adapter's A,
// [n, …, r] (for lm_head: h·Aᵀ; for embed_tokens: the rows of Aᵀ the token ids pick); rows [n] is
// the batch row of each of the n entries (nil: the entries are the rows). Mixed rows: each used
// adapter's first product is zeroed on the entries of other adapters and all are concatenated
// along the rank, with their scaled B side by side, so that one matmul gives every entry its own
// adapter's term (no [n, out, r] gather, which for lm_head would be vocabulary-sized).
func (lp *loraPass) outer(proj int, rows *ts.Tensor, dt gotch.DType, first func(A *ts.Tensor) *ts.Tensor) *ts.Tensor {
	get := func(a *Adapter) (A, B *ts.Tensor) { return *a.weight(-1, proj, false), *a.weight(-1, proj, true) }
	return lp.lowRank(get, rows, dt, first)
}

// tokenDelta is delta for entries x [n, in] of a forward call (the tokens an expert runs) that
// belong to the batch rows rows [n]: one rank-concatenated product as outer's, never a gather of
// every entry's own A and B. rows is only read when the rows' adapters differ.
func (lp *loraPass) tokenDelta(layer, proj int, x, rows *ts.Tensor) *ts.Tensor {
	get := func(a *Adapter) (A, B *ts.Tensor) { return a.a[layer][proj], a.b[layer][proj] }
	return lp.lowRank(get, rows, x.DType(), func(A *ts.Tensor) *ts.Tensor { return ts.MustLinear(x, A, ts.None) })
}

// lowRank is the low-rank term of the module whose A and B get returns for an adapter (nil: not
// targeted), on entries of the batch rows rows (nil: the entries are the rows), first(A) being the
// input's product with A (see outer).
func (lp *loraPass) lowRank(get func(a *Adapter) (A, B *ts.Tensor), rows *ts.Tensor, dt gotch.DType, first func(A *ts.Tensor) *ts.Tensor) *ts.Tensor {
	if lp == nil {
		return nil
	}
	if lp.uniform >= 0 {
		a := lp.mix.adapters[lp.uniform]
		A, B := get(a)
		if A == nil {
			return nil
		}
		return ts.MustLinear(first(cast(A, dt)), cast(B, dt), ts.None).MustMulScalar(ts.FloatScalar(a.Config.Scale()), true)
	}
	slots := lp.idx
	if rows != nil {
		slots = lp.idx.MustIndexSelect(0, rows, false)
	}
	var hs, bs []*ts.Tensor
	for k, i := range lp.used {
		a := lp.mix.adapters[i]
		A, B := get(a)
		if A == nil {
			continue
		}
		h := first(cast(A, dt)) // [n, …, r]
		shape := make([]int64, h.Dim())
		for j := range shape {
			shape[j] = 1
		}
		shape[0] = -1
		mask := slots.MustEq(ts.IntScalar(int64(k)), false).MustTotype(dt, true).MustView(shape, true)
		hs = append(hs, h.MustMul(mask, true))
		bs = append(bs, cast(B, dt).MustMulScalar(ts.FloatScalar(a.Config.Scale()), false))
	}
	if len(hs) == 0 {
		return nil
	}
	return ts.MustLinear(ts.MustCat(hs, -1), ts.MustCat(bs, 1), ts.None)
}

// embedDelta is embed_tokens' low-rank term for ids [B, T]: [B, T, hidden] in dt, or nil.
func (lp *loraPass) embedDelta(ids *ts.Tensor, dt gotch.DType) *ts.Tensor {
	return lp.outer(projEmbed, nil, dt, func(A *ts.Tensor) *ts.Tensor {
		return ts.MustEmbedding(A.MustT(false), ids, -1, false, false)
	})
}

// headDelta is lm_head's low-rank term for hidden states h [n, …, hidden] whose entries belong to
// the batch rows rows [n] (nil: the entries are the rows), or nil.
func (lp *loraPass) headDelta(h, rows *ts.Tensor) *ts.Tensor {
	return lp.outer(projHead, rows, h.DType(), func(A *ts.Tensor) *ts.Tensor { return ts.MustLinear(h, A, ts.None) })
}

// targets says whether any of the mix's adapters targets module proj.
func (mix *loraMix) targets(proj int) bool {
	if mix == nil {
		return false
	}
	for _, a := range mix.adapters {
		if a.targeted(proj) {
			return true
		}
	}
	return false
}

// addDelta is y + the low-rank term of projection proj on input x (y itself when none).
func addDelta(y *ts.Tensor, p *pass, proj int, x *ts.Tensor) *ts.Tensor {
	if p == nil || p.lora == nil {
		return y
	}
	if d := p.lora.delta(p.layer, proj, x); d != nil {
		return y.MustAdd(d, true)
	}
	return y
}

// addDeltaRows is addDelta for entries x [n, in] of the batch rows rows [n] (an expert's tokens);
// rows nil: addDelta.
func addDeltaRows(y *ts.Tensor, p *pass, proj int, x, rows *ts.Tensor) *ts.Tensor {
	if rows == nil || p == nil || p.lora == nil {
		return addDelta(y, p, proj, x)
	}
	if d := p.lora.tokenDelta(p.layer, proj, x, rows); d != nil {
		return y.MustAdd(d, true)
	}
	return y
}

// parameters are the view's adapters' tensors (see Model.Parameters).
func (mix *loraMix) parameters() []Param {
	if len(mix.adapters) == 1 {
		return mix.adapters[0].Parameters()
	}
	var out []Param
	for _, a := range mix.adapters {
		for _, p := range a.Parameters() {
			out = append(out, Param{a.Name + "/" + p.Name, p.T})
		}
	}
	slices.SortFunc(out, func(x, y Param) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// withRowAdapters is the model generation runs for rows: m (the base, maybe in the decoding
// layout) as it is when no row has an adapter, else a view of it with each row's adapter. The view
// is a copy of its own, which the engine narrows as rows finish (engine.shrink).
func withRowAdapters(m, root *Model, rows []*row) (*Model, error) {
	var adapters []*Adapter
	choice := make([]int, len(rows))
	for i, r := range rows {
		choice[i] = -1
		if r.adapter == nil {
			continue
		}
		k := slices.Index(adapters, r.adapter)
		if k < 0 {
			k = len(adapters)
			adapters = append(adapters, r.adapter)
		}
		choice[i] = k
	}
	if len(adapters) == 0 {
		return m, nil
	}
	layout, err := root.projLayout()
	if err != nil {
		return nil, err
	}
	for _, a := range adapters {
		if !sameLayout(a.layout, layout) || a.vocab != root.opts.Vocab || a.device != root.device {
			return nil, fmt.Errorf("adapter %s: made for %s and a vocabulary of %d on %v, the base has %s and %d on %v",
				a.Name, layoutString(a.layout), a.vocab, a.device, layoutString(layout), root.opts.Vocab, root.device)
		}
	}
	v := *m
	v.lora = &loraMix{root: root, adapters: adapters, rows: choice}
	return &v, nil
}

// selectRows is the choice for the rows keep of the batch (nil stays nil).
func (mix *loraMix) selectRows(keep []int64) *loraMix {
	if mix == nil || mix.rows == nil {
		return mix
	}
	c := *mix
	c.rows = make([]int, len(keep))
	for i, k := range keep {
		c.rows[i] = mix.rows[k]
	}
	return &c
}

// Thaw makes the base's weights require grad again (after Freeze), to train the base itself.
func (m *Model) Thaw() {
	for _, s := range m.Base().slots() {
		if *s.ptr != nil {
			(*s.ptr).MustRequiresGrad_(true)
		}
	}
}

// Freeze stops the base's weights from requiring grad, so that training adapters on it gives the
// base no gradient (and autograd keeps nothing for it). Torch thread.
func (m *Model) Freeze() {
	for _, s := range m.Base().slots() {
		if *s.ptr != nil {
			(*s.ptr).MustRequiresGrad_(false)
		}
	}
}
