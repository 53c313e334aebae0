package policy

// Continuous batching. Generation keeps up to MaxBatch rows in flight, each in a slot: one row of the
// KV cache, of the sampler's per-row tensors and of the adapter mix. A row that finishes keeps its
// slot only until a waiting row takes it, at the next step: the newcomer's prompt is prefilled on its
// own (with the other newcomers of that step) and its keys and values are copied into the slot.
// With no row waiting, finished rows are dropped as before, once they are half the batch; until then
// (once rows have joined, on the CPU) a step decodes the live rows alone, in their slots (liveView).
//
// The cache's columns are shared: every row writes its next token at column Len(). Row b's keys are
// the columns start[b] … Len()−1 (a valid mask hides the rest); a newcomer's prompt ends at Len()−1.
// Positions (RoPE) are per row, so a row's attention is the same whichever columns it sits in. When
// the columns run out the cache is rewritten without the columns no live row needs any more (those
// before the oldest live row's first), sized for every live row's longest possible remainder.
//
// The randomness is per row (rowStream): token j of a row draws the j-th number of its own stream,
// so a row samples the same tokens whatever it is batched with and whenever it joins (up to the
// floating-point noise of batched matmuls, as for static batches).

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/torch"
)

// source hands the engine the rows to start, in order.
type source interface {
	peek() *row // the next waiting row; nil: none now
	pop()       // takes the row peek returned
}

// rowList is a source of the rows of a slice.
type rowList []*row

func (l *rowList) peek() *row {
	if len(*l) == 0 {
		return nil
	}
	return (*l)[0]
}

func (l *rowList) pop() { *l = (*l)[1:] }

// traceEngine, when set (by tests), is told of each change of the cache's layout: "first", "join" or
// "relayout", with the slots and columns after it, and of each new set of live rows decoded alone
// ("live").
var traceEngine func(event string, slots, columns int)

func (e *engine) trace(event string) {
	if traceEngine != nil {
		traceEngine(event, len(e.rows), e.cache.Capacity())
	}
}

// engine runs rows with continuous batching on the torch thread, gradients off.
type engine struct {
	p       *Policy
	ctx     context.Context
	dm      *Model // the decoding model (see decodingModel), without per-row adapters
	m       *Model // dm with the rows' adapters
	maxRows int    // rows in flight at most (0: no limit)
	budget  int64  // KV-cache positions (slots × columns) at most (0: no limit)
	onDone  func(*row)

	rows   []*row  // the row in each slot: a finished one waits to be refilled or dropped
	next   []int64 // position of each slot's next token
	start  []int64 // first cache column of each slot's row
	cache  *KVCache
	valid  *ts.Tensor // [slots, capacity] bool
	smp    *sampler
	maxPos int64
	// ragged: rows have joined, so their ages differ: decoding attends over each row's own columns
	// (attendRows) instead of the batch's span with a mask. A batch no row has joined (a static
	// batch, a call whose rows all fit) decodes exactly as before continuous batching.
	ragged bool

	failed []*row // rows in flight when the run failed

	toks []int // each slot's token sampled last, not yet recorded
	lps  []float32
	tops [][]TopLogProb

	view *stepView // the live rows' view of the last step (see liveView); nil: none
}

// run generates until src has no row left and none is in flight. Finished rows are handed to onDone.
func (e *engine) run(src source) (err error) {
	defer e.free()
	defer func() {
		if err != nil {
			e.fail(e.rows)
		}
	}()
	for {
		joined, err := e.admit(src)
		if err != nil {
			return err
		}
		if e.live() == 0 {
			if src.peek() == nil {
				return nil
			}
			continue
		}
		if !joined {
			e.shrink()
		}
		e.ensureRoom()
		began := time.Now()
		e.decode()
		if d := e.p.decode; d != nil {
			d.elapsed += time.Since(began)
			d.steps++
		}
		if err := e.record(allSlots(len(e.rows))); err != nil {
			return err
		}
		if err := e.ctx.Err(); err != nil {
			return err
		}
	}
}

// allSlots is the slots 0 … n−1.
func allSlots(n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = int64(i)
	}
	return s
}

// live counts the rows in flight.
func (e *engine) live() int {
	n := 0
	for _, r := range e.rows {
		if !r.done {
			n++
		}
	}
	return n
}

// liveSlots are the slots of the rows in flight, in order, and their rows.
func (e *engine) liveSlots() (slots []int64, rows []*row) {
	for b, r := range e.rows {
		if !r.done {
			slots, rows = append(slots, int64(b)), append(rows, r)
		}
	}
	return slots, rows
}

// record appends the pending tokens of the given slots to their rows (see Policy.record).
func (e *engine) record(slots []int64) error {
	for _, b := range slots {
		r := e.rows[b]
		if r.done {
			continue
		}
		if math.IsNaN(float64(e.lps[b])) {
			return fmt.Errorf("policy %s: the model's logits are not finite (NaN or infinite weights?) at generated token %d", e.p.ID, len(r.resp))
		}
		if r.opt.Ctx != nil && r.opt.Ctx.Err() != nil {
			r.done, r.finish = true, llm.FinishAbort // its client left: the slot is free at the next step
		} else {
			var top []TopLogProb
			if e.tops[b] != nil && r.opt.TopLogProbs > 0 {
				top = e.tops[b][:r.opt.TopLogProbs]
			}
			e.p.record(r, e.toks[b], e.lps[b], top)
		}
		if r.done && r.opt.Record != nil {
			moe := e.dm.opts.MoE
			*r.opt.Record = Routes{Layers: len(e.dm.Layers), TopK: int(moe.TopK), IDs: r.routes}
		}
		if r.done && e.onDone != nil {
			e.onDone(r)
		}
	}
	return nil
}

// admit takes the waiting rows that fit (MaxBatch rows in flight, the KV budget; one row always
// fits when none is in flight) and starts them: prefill, first token recorded.
func (e *engine) admit(src source) (bool, error) {
	var cands []*row
	live := e.live()
	for r := src.peek(); r != nil; r = src.peek() {
		if e.maxRows > 0 && live+len(cands) >= e.maxRows {
			break
		}
		if (live > 0 || len(cands) > 0) && !e.fits(append(cands[:len(cands):len(cands)], r)) {
			break
		}
		src.pop()
		cands = append(cands, r)
	}
	if len(cands) == 0 {
		return false, nil
	}
	for _, r := range cands {
		r.rng = rowStream(r.sampling.Seed)
	}
	var err error
	if live == 0 {
		e.free()
		err = e.first(cands)
	} else {
		err = e.join(cands)
	}
	if err != nil {
		e.fail(cands)
	}
	return true, err
}

// fail marks rows that have not finished as failed (done, listed in e.failed).
func (e *engine) fail(rows []*row) {
	for _, r := range rows {
		if !r.done {
			r.done = true
			e.failed = append(e.failed, r)
		}
	}
}

// fits says whether the rows in flight and cands fit the KV budget: slots × the columns they need.
func (e *engine) fits(cands []*row) bool {
	if e.budget <= 0 {
		return true
	}
	if e.live() == 0 {
		var tp, maxNew int
		for _, r := range cands {
			tp, maxNew = max(tp, len(r.prompt)), max(maxNew, r.sampling.MaxNewTokens)
		}
		return int64(len(cands))*int64(tp+maxNew-1) <= e.budget
	}
	lo, hi := e.extent()
	L := int64(e.cache.Len())
	for _, r := range cands {
		lo, hi = min(lo, L-int64(len(r.prompt))), max(hi, L+int64(r.sampling.MaxNewTokens)-1)
	}
	slots := len(e.rows) + max(0, len(cands)-(len(e.rows)-e.live()))
	return int64(slots)*(hi-lo) <= e.budget
}

// extent is the range of cache columns [lo, hi) that the live rows need until they end: from the
// first column of the oldest to the last one the longest remainder may write.
func (e *engine) extent() (lo, hi int64) {
	L := int64(e.cache.Len())
	lo, hi = L, L
	for b, r := range e.rows {
		if !r.done {
			lo = min(lo, e.start[b])
			hi = max(hi, L+int64(r.sampling.MaxNewTokens-len(r.resp)))
		}
	}
	return lo, hi
}

// shrink drops the finished rows once they are half the batch (and the batch has at least four):
// the cache shrinks with them.
func (e *engine) shrink() {
	n, live := len(e.rows), e.live()
	if live > n/2 || n < 4 {
		return
	}
	e.dropView()
	keep, _ := e.liveSlots()
	_ = torch.Untracked(func() error {
		idx := ts.MustOfSlice(keep).MustTo(e.m.device, true)
		defer idx.MustDrop()
		e.cache.selectRows(idx)
		e.smp.selectRows(idx)
		e.valid = replace(e.valid, e.valid.MustIndexSelect(0, idx, false))
		return nil
	})
	if e.m.lora != nil {
		v := *e.m
		v.lora = v.lora.selectRows(keep)
		e.m = &v
	}
	rows, next, start := e.rows[:0:0], e.next[:0:0], e.start[:0:0]
	toks, lps, tops := e.toks[:0:0], e.lps[:0:0], e.tops[:0:0]
	for _, k := range keep {
		rows, next, start = append(rows, e.rows[k]), append(next, e.next[k]), append(start, e.start[k])
		toks, lps, tops = append(toks, e.toks[k]), append(lps, e.lps[k]), append(tops, e.tops[k])
	}
	e.rows, e.next, e.start, e.toks, e.lps, e.tops = rows, next, start, toks, lps, tops
}

// decode feeds each live row's last token to the model and samples its next one, in a scope of its
// own. In a batch no row has joined, finished rows ride along (their outputs are ignored) at a fixed
// position until shrink drops them, as static batches always did; in a ragged batch only the live
// rows are decoded, each in its slot of the cache (see liveView), so a finished row costs nothing
// until a waiting row takes its slot or shrink reclaims it.
func (e *engine) decode() {
	s := torch.NewScope()
	defer s.Close()
	v := e.liveView()
	B := int64(len(v.slots))
	ids := make([]int64, B)
	pos := make([]int64, B)
	u := make([]float64, B)
	for i, b := range v.slots {
		r := e.rows[b]
		ids[i], pos[i] = int64(e.p.PadID), e.next[b]
		if n := len(r.resp); n > 0 {
			ids[i] = int64(r.resp[n-1])
		}
		if !r.done && v.smp.anySample {
			u[i] = r.rng.Float64()
		}
		if !r.done {
			e.next[b]++
		}
	}
	dev := e.m.device
	idsT := ts.MustOfSlice(ids).MustTo(dev, true).MustView([]int64{B, 1}, true)
	posT := ts.MustOfSlice(pos).MustTo(dev, true).MustView([]int64{B, 1}, true)
	var valid *ts.Tensor
	if v.idx != nil {
		e.cache.slots, e.cache.slotIdx, e.cache.starts = v.slots, v.idx, e.rowStarts(v.slots)
		defer func() { e.cache.slots, e.cache.slotIdx = nil, nil }()
	} else {
		if e.ragged {
			e.cache.starts, e.cache.from = e.attention()
		}
		valid = e.valid.MustNarrow(1, 0, int64(e.cache.Len())+1, false)
	}
	rt := e.decodeRouting(v.m, v.slots)
	end := v.m.forwardPass()
	h := v.m.hidden(idsT, posT, valid, e.cache, e.maxPos, rt)
	e.keepDecodeRoutes(rt, v.slots)
	logits := v.m.logits(h).MustSqueezeDim(1, true)
	end()
	var uT *ts.Tensor
	if v.smp.anySample {
		uT = ts.MustOfSlice(u).MustTo(dev, true).MustView([]int64{B, 1}, true)
	}
	tok, lp, topLp, topIDs := v.smp.sampleAt(logits, uT)
	toks, lps := fetch(tok, lp)
	tops := slotTops(fetchTop(topLp, topIDs), int(B))
	for i, b := range v.slots {
		e.toks[b], e.lps[b], e.tops[b] = toks[i], lps[i], tops[i]
	}
}

// stepView is what a decoding step runs: the slots it decodes, in order, their rows, model (adapters)
// and sampler; idx (the slots on the device) is nil when they are all the slots.
type stepView struct {
	slots []int64
	rows  []*row
	idx   *ts.Tensor
	m     *Model
	smp   *sampler
}

// liveView is the view of a decoding step: every slot, or on the CPU in a ragged batch with finished
// rows in some slots the live rows alone (on CUDA, where a row's attention is several kernel
// launches, finished rows ride along and the step may attend as one batch). A view of live rows is
// kept until the rows in flight change.
func (e *engine) liveView() *stepView {
	all := &stepView{slots: allSlots(len(e.rows)), m: e.m, smp: e.smp}
	if !e.ragged || e.live() == len(e.rows) || e.m.device.IsCuda() {
		return all
	}
	slots, rows := e.liveSlots()
	if e.view != nil && slices.Equal(e.view.slots, slots) && slices.Equal(e.view.rows, rows) {
		return e.view
	}
	e.dropView()
	v := *e.m
	v.lora = v.lora.selectRows(slots)
	_ = torch.Untracked(func() error {
		e.view = &stepView{slots: slots, rows: rows, m: &v, smp: e.newSampler(rows),
			idx: ts.MustOfSlice(slots).MustTo(e.m.device, true)}
		return nil
	})
	e.trace("live")
	return e.view
}

// dropView frees the view of live rows.
func (e *engine) dropView() {
	if e.view != nil && e.view.idx != nil {
		e.view.idx.MustDrop()
		e.view.smp.free()
	}
	e.view = nil
}

// rowAttendCost is what attending row by row (attendRows) costs per row beyond its keys, in key
// columns of the batch path, where drmas's CPU kernel does not run (CUDA, CPU dtypes other than
// float32): libtorch's small operations of each row (64: the fastest of 32, 64, 256 and 1024 on the
// issue-39 benchmark of docs/performance.md, this machine, when they were issued from Go). With the
// kernel a row costs next to nothing beyond its keys (8 µs for 16 short rows and a layer here).
var rowAttendCost = int64(64)

// attention chooses how a decoding step attends once rows of different ages share the cache: row
// by row over each row's own columns (starts), or the batch over the columns from the oldest live
// row's first on (from, with the valid mask), whichever reads fewer columns counting rowAttendCost.
func (e *engine) attention() (starts []int64, from int64) {
	cost := rowAttendCost
	if rowsKernel(e.dm) {
		cost = 0
	}
	S := int64(e.cache.Len()) + 1
	lo, rows := S-1, int64(0)
	for b, r := range e.rows {
		if !r.done {
			lo = min(lo, e.start[b])
			rows += S - e.start[b] + cost
		}
	}
	if rows < int64(len(e.rows))*(S-lo) {
		return e.rowStarts(nil), 0
	}
	return nil, lo
}

// rowStarts is the first column of each of slots (nil: every slot) for attendRows: a finished
// row attends to its own new column only (its output is ignored).
func (e *engine) rowStarts(slots []int64) []int64 {
	if slots == nil {
		slots = allSlots(len(e.rows))
	}
	out := make([]int64, len(slots))
	for i, b := range slots {
		out[i] = e.start[b]
		if e.rows[b].done {
			out[i] = int64(e.cache.Len())
		}
	}
	return out
}

// slotTops is fetchTop's result with one entry per slot (nil entries when none were asked).
func slotTops(tops [][]TopLogProb, n int) [][]TopLogProb {
	if tops == nil {
		return make([][]TopLogProb, n)
	}
	return tops
}

// free releases the engine's tensors (the cache, the mask, the sampler) and empties it.
func (e *engine) free() {
	if e.cache != nil {
		e.cache.Free()
		e.valid.MustDrop()
		e.smp.free()
	}
	e.dropView()
	e.cache, e.valid, e.smp, e.ragged = nil, nil, nil, false
	e.rows, e.next, e.start, e.toks, e.lps, e.tops = nil, nil, nil, nil, nil, nil
}
