package policy

import (
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/torch"
)

// The slots' layout: how rows enter the engine's KV cache and how the cache is rewritten when its
// columns run out (see continuous.go).

// first starts an empty engine with rows as a static batch starts: prompts left-padded to the
// longest, one prefill, a cache with columns for the longest prompt and the most new tokens.
func (e *engine) first(rows []*row) error {
	var tp, maxNew int64
	for _, r := range rows {
		tp, maxNew = max(tp, int64(len(r.prompt))), max(maxNew, int64(r.sampling.MaxNewTokens))
	}
	B := len(rows)
	e.rows = rows
	e.next, e.start = make([]int64, B), make([]int64, B)
	for b, r := range rows {
		e.start[b], e.next[b] = tp-int64(len(r.prompt)), int64(len(r.prompt))
	}
	e.notePositions(rows)
	capacity := tp + maxNew - 1 // the last token is sampled but never fed back
	_ = torch.Untracked(func() error {
		e.cache = NewKVCache(e.dm, B, int(capacity))
		return nil
	})
	e.rebuildValid()
	e.rebuildSampler()
	if err := e.rebuildAdapters(); err != nil {
		return err
	}
	e.trace("first")
	s := torch.NewScope()
	defer s.Close()
	e.toks, e.lps, e.tops = e.prefill(e.m, rows, e.smp, e.cache, tp)
	return e.record(allSlots(B))
}

// notePositions raises the bound on positions to the last one rows may feed.
func (e *engine) notePositions(rows []*row) {
	for _, r := range rows {
		e.maxPos = max(e.maxPos, int64(len(r.prompt)+r.sampling.MaxNewTokens-2))
	}
}

// prefill runs rows' prompts, left-padded to tp, through m into cache (empty) and samples each
// row's first token with smp.
func (e *engine) prefill(m *Model, rows []*row, smp *sampler, cache *KVCache, tp int64) ([]int, []float32, [][]TopLogProb) {
	B := int64(len(rows))
	ids := make([]int64, B*tp)
	pos := make([]int64, B*tp)
	valid := make([]bool, B*tp)
	u := make([]float64, B)
	for i, r := range rows {
		pad := tp - int64(len(r.prompt))
		for j := int64(0); j < tp; j++ {
			k := int64(i)*tp + j
			ids[k] = int64(e.p.PadID)
			if j >= pad {
				ids[k], pos[k], valid[k] = int64(r.prompt[j-pad]), j-pad, true
			}
		}
		if smp.anySample {
			u[i] = r.rng.Float64()
		}
	}
	dev := m.device
	idsT := ts.MustOfSlice(ids).MustTo(dev, true).MustView([]int64{B, tp}, true)
	posT := ts.MustOfSlice(pos).MustTo(dev, true).MustView([]int64{B, tp}, true)
	validT := ts.MustOfSlice(valid).MustTo(dev, true).MustView([]int64{B, tp}, true)
	rt := e.prefillRouting(m, rows, tp)
	end := m.forwardPass()
	h := m.hidden(idsT, posT, validT, cache, e.maxPos, rt)
	e.keepPrefillRoutes(rt, rows, tp)
	logits := m.logits(h.MustNarrow(1, tp-1, 1, true)).MustSqueezeDim(1, true)
	end()
	var uT *ts.Tensor
	if smp.anySample {
		uT = ts.MustOfSlice(u).MustTo(dev, true).MustView([]int64{B, 1}, true)
	}
	tok, lp, topLp, topIDs := smp.sampleAt(logits, uT)
	toks, lps := fetch(tok, lp)
	return toks, lps, slotTops(fetchTop(topLp, topIDs), int(B))
}

// join starts rows in a running engine: their prompts are prefilled together in a cache of their
// own, each row goes to a finished row's slot (or a new one), its keys and values are copied there
// to end at column Len()−1, and its first token is recorded.
func (e *engine) join(rows []*row) error {
	s := torch.NewScope()
	defer s.Close()
	var tp int64
	for _, r := range rows {
		tp = max(tp, int64(len(r.prompt)))
	}
	e.notePositions(rows)
	m, err := withRowAdapters(e.dm, e.p.Model.Base(), rows)
	if err != nil {
		return err
	}
	smp := e.newSampler(rows)
	group := NewKVCache(e.dm, len(rows), int(tp))
	toks, lps, tops := e.prefill(m, rows, smp, group, tp)

	slots := e.freeSlots(len(rows))
	L := int64(e.cache.Len())
	lo, hi := e.extent()
	lo = min(lo, L-tp)
	for _, r := range rows {
		hi = max(hi, L+int64(r.sampling.MaxNewTokens)-1)
	}
	n := len(e.rows)
	if grow := len(rows) - len(slots); grow > 0 || lo < 0 || hi > int64(e.cache.Capacity()) ||
		(e.budget > 0 && int64(n)*int64(e.cache.Capacity()) > e.budget) {
		for k := 0; k < grow; k++ {
			slots = append(slots, int64(n+k))
			e.rows, e.next, e.start = append(e.rows, rows[0]), append(e.next, 0), append(e.start, 0)
			e.toks, e.lps, e.tops = append(e.toks, 0), append(e.lps, 0), append(e.tops, nil)
		}
		e.relayout(len(e.rows), lo, hi-lo)
		L = int64(e.cache.Len())
	}
	for i, r := range rows {
		b, P := slots[i], int64(len(r.prompt))
		e.copyPrompt(group, i, tp-P, b, L-P, P)
		e.rows[b], e.start[b], e.next[b] = r, L-P, P
		e.toks[b], e.lps[b], e.tops[b] = toks[i], lps[i], tops[i]
	}
	e.dropView()
	e.rebuildValid()
	e.rebuildSampler()
	if err := e.rebuildAdapters(); err != nil {
		return err
	}
	e.ragged = true
	e.trace("join")
	return e.record(slots)
}

// freeSlots returns up to n slots whose rows have finished.
func (e *engine) freeSlots(n int) []int64 {
	var out []int64
	for b, r := range e.rows {
		if r.done && len(out) < n {
			out = append(out, int64(b))
		}
	}
	return out
}

// copyPrompt copies n columns of row i of src (from column from) into slot b of the engine's cache
// (from column to), in every layer.
func (e *engine) copyPrompt(src *KVCache, i int, from, b, to, n int64) {
	s := torch.NewScope()
	defer s.Close()
	for l := range e.cache.k {
		for _, p := range [][2]*ts.Tensor{{e.cache.k[l], src.k[l]}, {e.cache.v[l], src.v[l]}} {
			dst := p[0].MustNarrow(0, b, 1, false).MustNarrow(2, to, n, true)
			dst.Copy_(p[1].MustNarrow(0, int64(i), 1, false).MustNarrow(2, from, n, true))
		}
	}
}

// relayout rewrites the cache as slots rows of capacity columns whose column 0 is the old column lo
// (negative: the old columns move right): the columns before lo are dropped, new slots are empty.
func (e *engine) relayout(slots int, lo, capacity int64) {
	c := e.cache
	L := int64(c.Len())
	a := max(lo, 0) // the first old column kept
	size := c.k[0].MustSize()
	shape := []int64{int64(slots), size[1], capacity, size[3]}
	for _, ts2 := range [][]*ts.Tensor{c.k, c.v} {
		for l, old := range ts2 {
			var fresh *ts.Tensor
			_ = torch.Untracked(func() error {
				fresh = ts.MustZeros(shape, e.dm.dtype, e.dm.device)
				return nil
			})
			if L > a {
				s := torch.NewScope()
				dst := fresh.MustNarrow(0, 0, c.batch, false).MustNarrow(2, a-lo, L-a, true)
				dst.Copy_(old.MustNarrow(2, a, L-a, false))
				s.Close()
			}
			ts2[l] = replace(old, fresh)
		}
	}
	c.batch, c.capacity, c.length = int64(slots), capacity, int(L-lo)
	for b := range e.start {
		e.start[b] = max(0, e.start[b]-lo)
	}
	e.trace("relayout")
}

// ensureRoom makes room for the next column: when the cache is full it is rewritten from the oldest
// live row's first column, with columns for the longest remainder.
func (e *engine) ensureRoom() {
	if e.cache.Len() < e.cache.Capacity() {
		return
	}
	lo, hi := e.extent()
	e.relayout(len(e.rows), lo, hi-lo)
	e.rebuildValid()
}

// rebuildValid makes the mask of each slot's columns: from its first on.
func (e *engine) rebuildValid() {
	B, C := int64(len(e.rows)), int64(e.cache.Capacity())
	valid := make([]bool, B*C)
	for b := range e.rows {
		for c := e.start[b]; c < C; c++ {
			valid[int64(b)*C+c] = true
		}
	}
	_ = torch.Untracked(func() error {
		t := ts.MustOfSlice(valid).MustTo(e.dm.device, true).MustView([]int64{B, C}, true)
		if e.valid != nil {
			e.valid.MustDrop()
		}
		e.valid = t
		return nil
	})
}

// newSampler is a sampler for rows (in the current scope), with their uniform numbers handed to
// sampleAt.
func (e *engine) newSampler(rows []*row) *sampler {
	settings := make([]llm.Sampling, len(rows))
	for i, r := range rows {
		settings[i] = r.sampling
	}
	smp := newSampler(settings, 0, int64(e.dm.Config.VocabSize), e.dm.compute, e.dm.device)
	for _, r := range rows {
		smp.topN = max(smp.topN, int64(r.opt.TopLogProbs))
	}
	return smp
}

// rebuildSampler remakes the slots' sampler.
func (e *engine) rebuildSampler() {
	_ = torch.Untracked(func() error {
		if e.smp != nil {
			e.smp.free()
		}
		e.smp = e.newSampler(e.rows)
		return nil
	})
}

// rebuildAdapters remakes the model with each slot's adapter.
func (e *engine) rebuildAdapters() error {
	m, err := withRowAdapters(e.dm, e.p.Model.Base(), e.rows)
	if err != nil {
		return err
	}
	e.m = m
	return nil
}
