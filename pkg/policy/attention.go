package policy

// Attention: softmax(q kᵀ · scale + masks) v for every family, in memory linear in the sequence
// length, by one of two implementations behind attend:
//
//   - libtorch's fused scaled_dot_product_attention (flash / memory-efficient kernels on CUDA, flash on
//     the CPU; libtorch 2.1 and later, through the attention shim that scripts/torchsetup writes), where
//     it applies: no padding and no sliding window, and either T queries among themselves with the
//     causal mask done by the kernel (training, a prefill without padding) or one query after the
//     cache (decoding). Only when libtorch picks a fused kernel; never its math kernel, which holds
//     the T × S scores. DRMAS_ATTENTION=tiles turns it off.
//   - tiles of query rows, below, everywhere else (Debian's libtorch 1.13 has no fused attention).
//
// Both give the same outputs within float tolerance (TestFusedAttentionMatchesTiles).
//
// Tiles:
// A tile is n consecutive queries of every head; it meets only the keys it may see (causal: up to
// its last query; sliding window: from its first query's window on), so the largest score matrix
// that ever exists is [B, H, n, S] with n chosen to fit tileBudget (a T × S matrix exists only when
// it fits). Grouped-query heads are not repeated: the G query heads of one key/value head are
// stacked on the row dimension, [B, KV, G·n, D] against [B, KV, S, D].
//
// attendTiles is the forward pass; it can return each row's log-sum-exp, which attendBackward uses to
// recompute a tile's probabilities instead of keeping them (the backward of flash attention,
// written with libtorch's dense ops: it runs the same on Debian's libtorch 1.13, which has no
// scaled_dot_product_attention, and on CUDA). (One fused softmax per tile instead of log-sum-exp,
// subtract and exp, with softmax's backward kernel for dS, measured 5–10% slower on the training step
// of 4,096 tokens here: docs/long-sequences.md.) Under grad mode attend is also differentiable by
// autograd (every op it uses is), at the cost of the probabilities autograd keeps; training takes
// the explicit backward instead (see backprop.go).

import (
	"fmt"
	"os"

	"github.com/sugarme/gotch"
	lib "github.com/sugarme/gotch/libtch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// tileBudget and tileBudgetCUDA bound the elements of one tile's score matrix [B, H, n, S] on the
// CPU and on CUDA; a tile has at least tileFloor query rows (or all of them). They are pkg/arch's
// defaults (see arch.TileBudget, which pkg/plan reads), in variables so that tests can force many
// small tiles.
var (
	tileBudget     = arch.TileBudget
	tileBudgetCUDA = arch.TileBudgetCUDA
	tileFloor      = arch.TileFloor
)

// tileRows is the number of query rows of one attention tile for q on its device (arch.TileRows
// under this package's budgets).
func tileRows(q *ts.Tensor, B, H, T, S int64) int64 {
	budget := tileBudget
	if q.MustDevice().IsCuda() {
		budget = tileBudgetCUDA
	}
	return arch.TileRows(budget, tileFloor, B, H, T, S)
}

// attnSpec says which keys each query of a call may see.
type attnSpec struct {
	past    int64       // the queries sit at absolute indices past … past+T−1; keys at 0 … S−1
	window  int64       // sliding window: a query at i sees keys i−window+1 … i; 0: causal only
	valid   *ts.Tensor  // [B, ≥S] bool: real keys (false for left padding); nil: all keys are real
	scale   *ts.Tensor  // 1/√head_dim, 0-dim, compute dtype
	compute gotch.DType // scores and softmax: float32 (float64 for a float64 model)

	scaleValue float64 // scale as a number (for libtorch's fused kernel)

	seg *segments // packed rows (several sequences in a row); nil: one sequence per row
}

// segments are the sequences of packed rows (see TrainScorePacked): each row holds several
// sequences one after the other, a query sees only the keys of its own sequence (a block-diagonal
// causal mask) and positions restart at 0 with each sequence. Calls without a cache only.
type segments struct {
	start   *ts.Tensor // [B, T] int64: the first column of the sequence each column belongs to
	lo, hi  []int64    // per column: the least and greatest start over the rows
	longest int64      // the longest sequence (or padding)
}

// newSegments describes rows of sequences of the given lengths (padding after a row's last
// sequence is a sequence of its own), T columns wide, on dev.
func newSegments(rows [][]int, T int64, dev gotch.Device) *segments {
	B := int64(len(rows))
	sg := &segments{lo: make([]int64, T), hi: make([]int64, T)}
	start := make([]int64, B*T)
	for b, lens := range rows {
		col := int64(0)
		for _, n := range append(lens[:len(lens):len(lens)], int(T)) {
			first := col
			for ; col < T && col < first+int64(n); col++ {
				start[int64(b)*T+col] = first
			}
		}
	}
	for c := int64(0); c < T; c++ {
		sg.lo[c], sg.hi[c] = start[c], start[c]
		for b := int64(1); b < B; b++ {
			sg.lo[c], sg.hi[c] = min(sg.lo[c], start[b*T+c]), max(sg.hi[c], start[b*T+c])
		}
	}
	sg.start = ts.MustOfSlice(start).MustTo(dev, true).MustView([]int64{B, T}, true)
	return sg
}

// keys is the range [lo, hi) of keys that the queries t0 … t0+n−1 may see.
func (sp *attnSpec) keys(t0, n int64) (lo, hi int64) {
	hi = sp.past + t0 + n
	if sp.window > 0 {
		lo = max(0, sp.past+t0-sp.window+1)
	}
	if sp.seg != nil { // no query sees the keys before its own sequence's first
		lo = max(lo, sp.seg.lo[sp.past+t0])
	}
	return lo, hi
}

// mask applies the tile's masks to its scores s [B, KV, G·n, Sk] (queries t0 … t0+n−1, keys
// lo … lo+Sk−1): forbidden pairs get maskValue. Plain causal attention needs only the last n keys'
// block masked (earlier keys precede every query of the tile), in place; a window or padding mask
// the whole tile.
func (sp *attnSpec) mask(s *ts.Tensor, t0, n, lo int64) *ts.Tensor {
	size := s.MustSize()
	B, KV, Sk := size[0], size[1], size[3]
	G := size[2] / n
	q0 := sp.past + t0 // absolute index of the tile's first query; query i is at q0 + i, key j at lo + j
	dev := s.MustDevice()
	fill := ts.FloatScalar(maskValue(sp.compute))
	// packed rows: a tile whose queries all start their sequence at lo (or before it) needs no
	// sequence mask beyond the causal one
	segMask := sp.seg != nil && sp.seg.hi[q0+n-1] > lo
	if sp.window == 0 && sp.valid == nil && !segMask {
		if n == 1 {
			return s
		}
		// keys q0 … q0+n−1 are the last n: key q0+j is after query q0+i when j > i
		block := s.MustView([]int64{B, KV, G, n, Sk}, false).MustNarrow(4, Sk-n, n, true)
		block.MustMaskedFill_(ts.MustOnes([]int64{n, n}, gotch.Bool, dev).MustTriu(1, true), fill)
		block.MustDrop()
		return s
	}
	var out *ts.Tensor
	if lo+Sk-1 > q0 { // causal: key lo+j after query q0+i ⟺ j − i > q0 − lo
		out = ts.MustOnes([]int64{n, Sk}, gotch.Bool, dev).MustTriu(q0-lo+1, true)
	}
	if sp.window > 0 && lo <= q0+n-1-sp.window { // window: key lo+j ≤ query q0+i − window
		old := ts.MustOnes([]int64{n, Sk}, gotch.Bool, dev).MustTril(q0-sp.window-lo, true)
		out = orMask(out, old)
	}
	if out != nil {
		out = out.MustView([]int64{1, 1, 1, n, Sk}, true)
	}
	if segMask { // key lo+j is in an earlier sequence than query q0+i: lo+j < start(q0+i)
		keys := ts.MustArangeStart(ts.IntScalar(lo), ts.IntScalar(lo+Sk), gotch.Int64, dev).MustView([]int64{1, 1, Sk}, true)
		starts := sp.seg.start.MustNarrow(1, q0, n, false).MustUnsqueeze(-1, true) // [B, n, 1]
		out = orMask(out, keys.MustLtTensor(starts, true).MustView([]int64{B, 1, 1, n, Sk}, true))
		starts.MustDrop()
	}
	if sp.valid != nil {
		pad := sp.valid.MustNarrow(1, lo, Sk, false).MustLogicalNot(true).MustView([]int64{B, 1, 1, 1, Sk}, true)
		out = orMask(out, pad)
	}
	if out == nil {
		return s
	}
	return s.MustView([]int64{B, KV, G, n, Sk}, true).MustMaskedFill(out, fill, true).MustView([]int64{B, KV, G * n, Sk}, true)
}

// orMask is a ∨ b, consuming both; nil is the all-false mask.
func orMask(a, b *ts.Tensor) *ts.Tensor {
	if a == nil {
		return b
	}
	return a.MustLogicalOr(b, true)
}

// tileScores is q_t kᵀ · scale over the keys the tile may see, masked, in the compute dtype:
// [B, KV, G·n, Sk], with the scaled query rows qt·scale [B, KV, G·n, D] and the keys' range.
func tileScores(qg, k *ts.Tensor, t0, n int64, sp *attnSpec) (s, qs *ts.Tensor, lo, Sk int64) {
	size := qg.MustSize() // [B, KV, G, T, D]
	B, KV, G, T, D := size[0], size[1], size[2], size[3], size[4]
	var qt *ts.Tensor
	if n == T {
		qt = qg
	} else {
		qt = qg.MustNarrow(3, t0, n, false)
	}
	// The scale goes on the queries ([n, D]) rather than on the scores ([n, S]).
	qs = qt.MustMul(sp.scale, false).MustReshape([]int64{B, KV, G * n, D}, true)
	lo, hi := sp.keys(t0, n)
	Sk = hi - lo
	s = qs.MustMatmul(k.MustNarrow(2, lo, Sk, false).MustTranspose(2, 3, true), false)
	if s.DType() != sp.compute {
		s = s.MustTotype(sp.compute, true)
	}
	return sp.mask(s, t0, n, lo), qs, lo, Sk
}

// fusedAttention says whether libtorch's fused attention is on (it is where the libtorch has it,
// unless DRMAS_ATTENTION=tiles); a variable so that tests can compare the two implementations.
var fusedAttention = lib.DrmasSDPAAvailable() && os.Getenv("DRMAS_ATTENTION") != "tiles"

// FusedAttention reports whether this build's attention takes libtorch's fused kernel where it
// applies (libtorch 2.1 and later, not turned off by DRMAS_ATTENTION=tiles).
func FusedAttention() bool { return fusedAttention }

// fused is attend by libtorch's fused kernel, [B, T, H·D], or nil where it does not apply (see the
// file's comment). Differentiable by autograd under grad mode.
func fused(q, k, v *ts.Tensor, sp *attnSpec) *ts.Tensor {
	if !fusedAttention || sp.window > 0 || sp.valid != nil || sp.seg != nil {
		return nil
	}
	qs, S := q.MustSize(), k.MustSize()[2]
	B, H, T, D := qs[0], qs[1], qs[2], qs[3]
	var causal bool
	switch {
	case sp.past == 0 && T == S:
		causal = T > 1
	case T == 1 && sp.past == S-1: // one query after the cache sees every key
	default:
		return nil
	}
	out, _, ok, err := lib.DrmasSDPA(lib.Ctensor(q.Ctensor()), lib.Ctensor(k.Ctensor()), lib.Ctensor(v.Ctensor()), causal, sp.scaleValue)
	if err != nil {
		panic(fmt.Sprintf("policy: scaled_dot_product_attention of q %v, k %v: %v", qs, k.MustSize(), err))
	}
	if !ok {
		return nil
	}
	return ts.New(out).MustTranspose(1, 2, true).MustReshape([]int64{B, T, H * D}, true)
}

// attend is attention over q [B, H, T, D] and k, v [B, KV, S, D] (H a multiple of KV): the output
// [B, T, H·D] in v's dtype. It takes libtorch's fused kernel where it applies (fused), tiles
// otherwise; run the tiles with gradients off in training (attendBackward is their backward).
func attend(q, k, v *ts.Tensor, sp *attnSpec) *ts.Tensor {
	if o := fused(q, k, v, sp); o != nil {
		return o
	}
	o, _ := attendTiles(q, k, v, sp, false)
	return o
}

// attendRows is attend for one query per row (a decoding step, q [B, H, 1, D]) where row i's keys
// are the columns starts[i] … S−1 of slot slots[i] of k and v (nil slots: slot i), rows of different
// ages in one cache: each row attends over its own keys alone (from its window's first column on,
// with a sliding window), so no work goes to the columns only other rows use and no mask is needed.
// The loop over the rows runs in C++ (drmas_attend_rows, scripts/torchsetup/attention) on libtorch's
// intra-op threads: a kernel of its own for float32 on the CPU (rowsKernel), libtorch's matmul and
// softmax row by row otherwise.
func attendRows(q, k, v *ts.Tensor, slots, starts []int64, sp *attnSpec) *ts.Tensor {
	if len(starts) == 0 {
		panic("policy: attendRows: no rows")
	}
	o, err := lib.DrmasAttendRows(lib.Ctensor(q.Ctensor()), lib.Ctensor(k.Ctensor()), lib.Ctensor(v.Ctensor()),
		lib.Ctensor(sp.scale.Ctensor()), slots, starts, sp.window)
	if err != nil {
		panic(fmt.Sprintf("policy: attention of rows of q %v, k %v: %v", q.MustSize(), k.MustSize(), err))
	}
	return ts.New(o)
}

// rowsKernel says whether attendRows runs drmas's CPU kernel for m (float32 on the CPU), where a
// row costs little beyond reading its keys and values.
func rowsKernel(m *Model) bool { return !m.device.IsCuda() && m.dtype == gotch.Float }

// attendTiles is attend over tiles of query rows, and with withLSE also the log-sum-exp of each
// query's scores [B, KV, G, T] (compute dtype; head h = kv·G + g) for attendBackward.
func attendTiles(q, k, v *ts.Tensor, sp *attnSpec, withLSE bool) (o, lse *ts.Tensor) {
	qs, ks := q.MustSize(), k.MustSize()
	B, H, T, D := qs[0], qs[1], qs[2], qs[3]
	KV, S := ks[1], ks[2]
	G := H / KV
	qg := q.MustReshape([]int64{B, KV, G, T, D}, false)
	n := tileRows(q, B, H, T, S)
	var out, lseAll *ts.Tensor
	if n < T {
		out = ts.MustEmpty([]int64{B, KV, G, T, D}, v.DType(), v.MustDevice())
		if withLSE {
			lseAll = ts.MustEmpty([]int64{B, KV, G, T}, sp.compute, v.MustDevice())
		}
	}
	for t0 := int64(0); t0 < T; t0 += n {
		rows := min(n, T-t0)
		s := torch.NewScope()
		sc, _, lo, Sk := tileScores(qg, k, t0, rows, sp)
		var p, l *ts.Tensor
		if withLSE { // training, gradients off: in place
			l = sc.MustLogsumexp([]int64{-1}, true, false) // [B, KV, G·n, 1]
			sc.MustSub_(l)
			sc.MustExp_()
			p = sc
		} else {
			p = sc.MustSoftmax(-1, gotch.Invalid, true)
		}
		if p.DType() != v.DType() {
			p = p.MustTotype(v.DType(), true)
		}
		ot := p.MustMatmul(v.MustNarrow(2, lo, Sk, false), true).MustView([]int64{B, KV, G, rows, D}, true)
		if out == nil { // one tile: its results are the results
			out = ot
			if withLSE {
				lseAll = l.MustView([]int64{B, KV, G, rows}, true)
			}
			s.Keep(out)
			if withLSE {
				s.Keep(lseAll)
			}
		} else {
			out.MustNarrow(3, t0, rows, false).Copy_(ot)
			if withLSE {
				lseAll.MustNarrow(3, t0, rows, false).Copy_(l.MustView([]int64{B, KV, G, rows}, true))
			}
		}
		s.Close()
	}
	qg.MustDrop()
	o = out.MustView([]int64{B, H, T, D}, true).MustTranspose(1, 2, true).MustReshape([]int64{B, T, H * D}, true)
	return o, lseAll
}

// attendBackward is the gradient of attendTiles: given its inputs, its output o [B, T, H·D], the
// log-sum-exp it returned and the gradient dO of the output, it returns dq [B, H, T, D] and dk,
// dv [B, KV, S, D], in the inputs' dtype. Each tile's probabilities are recomputed from the
// log-sum-exp; no more than one tile's scores exist at a time. Run it with gradients off.
func attendBackward(q, k, v, o, lse, dO *ts.Tensor, sp *attnSpec) (dq, dk, dv *ts.Tensor) {
	qs, ks := q.MustSize(), k.MustSize()
	B, H, T, D := qs[0], qs[1], qs[2], qs[3]
	KV, S := ks[1], ks[2]
	G := H / KV
	dt, dev := q.DType(), q.MustDevice()
	heads := func(x *ts.Tensor) *ts.Tensor { // [B, T, H·D] → [B, KV, G, T, D]
		return x.MustView([]int64{B, T, H, D}, false).MustTranspose(1, 2, true).MustReshape([]int64{B, KV, G, T, D}, true)
	}
	qg := q.MustReshape([]int64{B, KV, G, T, D}, false)
	dO5 := heads(dO)
	// delta = rowsum(dO ∘ O): the softmax's backward term for each query.
	o5 := heads(o)
	delta := cast(dO5, sp.compute).MustMul(cast(o5, sp.compute), false).MustSumDimIntlist([]int64{-1}, false, sp.compute, true)
	o5.MustDrop()
	dq5 := ts.MustEmpty([]int64{B, KV, G, T, D}, dt, dev)
	acc := sp.compute // dk and dv add up over tiles: in the compute dtype
	dkAcc := ts.MustZeros([]int64{B, KV, S, D}, acc, dev)
	dvAcc := ts.MustZeros([]int64{B, KV, S, D}, acc, dev)
	n := tileRows(q, B, H, T, S)
	for t0 := int64(0); t0 < T; t0 += n {
		rows := min(n, T-t0)
		s := torch.NewScope()
		p, qs, lo, Sk := tileScores(qg, k, t0, rows, sp)
		// P = exp(S − lse), in place: the forward's probabilities, recomputed
		p.MustSub_(lse.MustNarrow(3, t0, rows, false).MustReshape([]int64{B, KV, G * rows, 1}, true))
		p.MustExp_()
		dOt := dO5.MustNarrow(3, t0, rows, false).MustReshape([]int64{B, KV, G * rows, D}, true)
		kt, vt := k.MustNarrow(2, lo, Sk, false), v.MustNarrow(2, lo, Sk, false)
		// dV += Pᵀ dO
		dvAcc.MustNarrow(2, lo, Sk, false).MustAdd_(cast(p, dt).MustTranspose(2, 3, false).MustMatmul(dOt, true))
		// dS = P ∘ (dP − delta), dP = dO Vᵀ, in place
		ds := cast(dOt.MustMatmul(vt.MustTranspose(2, 3, false), false), sp.compute)
		ds.MustSub_(delta.MustNarrow(3, t0, rows, false).MustReshape([]int64{B, KV, G * rows, 1}, true))
		ds.MustMul_(p)
		p.MustDrop()
		ds = cast(ds, dt)
		// S = (Q·scale) Kᵀ: dQ = dS K · scale, dK += dSᵀ (Q·scale)
		dq5.MustNarrow(3, t0, rows, false).Copy_(ds.MustMatmul(kt, false).MustMul(sp.scale, true).MustView([]int64{B, KV, G, rows, D}, true))
		dkAcc.MustNarrow(2, lo, Sk, false).MustAdd_(ds.MustTranspose(2, 3, false).MustMatmul(qs, true))
		s.Close()
	}
	qg.MustDrop()
	dO5.MustDrop()
	delta.MustDrop()
	dq = dq5.MustView([]int64{B, H, T, D}, true)
	return dq, cast(dkAcc, dt), cast(dvAcc, dt)
}
