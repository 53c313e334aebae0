package policy

// The training forward and backward, in pieces whose memory is linear in the sequence length.
//
// TrainScore runs the forward and hands back the response tokens' log-probs (and entropies) as
// leaves: the caller builds any loss on them and calls Backprop.Backward(loss), which walks the
// model backwards one piece at a time, each piece's graph made (or kept) only while it is needed:
//
//	loss → log-probs and entropies → lm_head, chunk by chunk (recomputed, one chunk of logits at a time)
//	     → final norm → each layer from the last: finish (o_proj, MLP) → attention (libtorch's fused
//	       kernel's own backward, or attendBackward: tiles recomputed from the log-sum-exp) → qkv → the layer's input → …
//	     → embeddings
//
// A piece's gradient reaches the one before it as the gradient of a leaf (a detached input with
// requires_grad); the piece's backward is that of Σ(output ∘ gradient), whose gradient with
// respect to the output is exactly the given one. Parameters' gradients add up in their .grad as
// with one backward call.
//
// With checkpointing, the forward keeps only each layer's input and the backward recomputes the
// layer before taking its backward (Hugging Face's gradient_checkpointing, per decoder layer);
// without, each layer's two graphs (qkv, finish) and its attention output are kept (with the fused
// kernel, its graph too: what flash attention keeps for backward, linear in the length; with the
// tiles, each query's log-sum-exp).

import (
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// logitsBudget bounds one chunk of logits, in elements: pkg/arch's default (arch.LogitsBudget, which
// pkg/plan reads), in a variable so that tests can force many small chunks.
var logitsBudget = arch.LogitsBudget

// logitsChunk is the number of tokens per chunk of lm_head for a vocabulary of V.
func logitsChunk(V, tokens int64) int64 { return arch.LogitsChunk(logitsBudget, V, tokens) }

// Backprop is the backward half of a training forward (see TrainScore). Its tensors belong to the
// torch scope TrainScore ran in; Backward frees each piece once it is done with it.
type Backprop struct {
	m          *Model
	p          *pass
	checkpoint bool         // the model's gradient checkpointing
	recompute  bool         // each layer recomputed in backward: checkpointing, or sharded weights (units.go)
	emb        *ts.Tensor   // the token embeddings, with their graph
	inputs     []*ts.Tensor // checkpointing: each layer's input (no graph)
	saved      []*layerPass // no checkpointing: each layer's graphs
	last       *ts.Tensor   // leaf: the last layer's output
	sel        *ts.Tensor   // the response positions' final hidden states [N, hidden], graph from last
	selLeaf    *ts.Tensor   // sel detached, the head's input
	targets    *ts.Tensor   // [N] response tokens
	rows       *ts.Tensor   // [N] the sequence each response token belongs to
	mask       *ts.Tensor   // [N] 1 on response tokens, 0 on padding
	lp, ent    *ts.Tensor   // leaves handed to the caller, [b, R]
	// A mixture-of-experts model's load-balancing loss: the leaf handed to the caller, and its
	// gradient with respect to each layer's sum of router probabilities (routing.auxLoss).
	aux, auxGrad *ts.Tensor
	done         bool
}

// layerPass is one layer's forward with its graphs: x → (q, k, v) → attention → o → y.
type layerPass struct {
	x          *ts.Tensor // leaf: the layer's input
	q, k, v    *ts.Tensor // qkv's outputs, with their graph from x
	ql, kl, vl *ts.Tensor // with the fused kernel: q, k, v as leaves, o's graph starts there
	o          *ts.Tensor // the attention's output (tiles: no graph; fused: its graph from ql, kl, vl)
	lse        *ts.Tensor // tiles: the log-sum-exp of each query's scores, for attendBackward
	oLeaf      *ts.Tensor // o as a leaf: finish's input
	y          *ts.Tensor // finish's output, with its graph from x and oLeaf
	aux        *ts.Tensor // a sparse layer's sum of router probabilities, with its graph (routing.aux); nil: none
}

// run makes the layer's forward with graphs from a leaf copy of x.
func (lp *layerPass) run(l layer, x *ts.Tensor, p *pass) {
	lp.x = x.MustDetach(false).MustSetRequiresGrad(true, true)
	lp.q, lp.k, lp.v = l.qkv(lp.x, p)
	sp := p.spec()
	// libtorch's fused kernel keeps what its backward needs (linear in the length); the tiles keep
	// nothing and attendBackward recomputes them.
	if fusedAttention {
		asLeaf := func(t *ts.Tensor) *ts.Tensor { return t.MustDetach(false).MustSetRequiresGrad(true, true) }
		ql, kl, vl := asLeaf(lp.q), asLeaf(lp.k), asLeaf(lp.v)
		if lp.o = fused(ql, kl, vl, sp); lp.o != nil {
			lp.ql, lp.kl, lp.vl = ql, kl, vl
		} else {
			ql.MustDrop()
			kl.MustDrop()
			vl.MustDrop()
		}
	}
	if lp.o == nil {
		_ = torch.NoGrad(func() error {
			lp.o, lp.lse = attendTiles(lp.q.MustDetach(false), lp.k.MustDetach(false), lp.v.MustDetach(false), sp, true)
			return nil
		})
	}
	lp.oLeaf = lp.o.MustDetach(false).MustSetRequiresGrad(true, false)
	lp.y = l.finish(lp.x, lp.oLeaf, p)
	lp.aux = p.moe.takeAux(p.layer)
}

// tensors are the pass's tensors (to keep or drop them together).
func (lp *layerPass) tensors() []*ts.Tensor {
	all := []*ts.Tensor{lp.x, lp.q, lp.k, lp.v, lp.o, lp.oLeaf, lp.y}
	if lp.aux != nil {
		all = append(all, lp.aux)
	}
	if lp.ql != nil {
		return append(all, lp.ql, lp.kl, lp.vl)
	}
	return append(all, lp.lse)
}

// backward takes the layer's backward for the gradient g of its output (and auxGrad of its sum of
// router probabilities, for the load-balancing loss; nil: none) and returns the gradient of its
// input. Parameters' gradients accumulate.
func (lp *layerPass) backward(g, auxGrad *ts.Tensor, p *pass) *ts.Tensor {
	if lp.aux != nil && auxGrad != nil {
		s := lp.y.MustMul(g, false).MustSum(gotch.Invalid, true)
		s.MustAdd(lp.aux.MustMul(auxGrad, false).MustSum(gotch.Invalid, true), true).MustBackward()
	} else {
		backwardWith(g, lp.y)
	}
	dO := lp.oLeaf.MustGrad(false)
	var dq, dk, dv *ts.Tensor
	if lp.ql != nil {
		backwardWith(dO, lp.o)
		dq, dk, dv = lp.ql.MustGrad(false), lp.kl.MustGrad(false), lp.vl.MustGrad(false)
	} else {
		_ = torch.NoGrad(func() error {
			q, k, v := lp.q.MustDetach(false), lp.k.MustDetach(false), lp.v.MustDetach(false)
			dq, dk, dv = attendBackward(q, k, v, lp.o, lp.lse, dO, p.spec())
			return nil
		})
	}
	backwardWith3(lp.q, dq, lp.k, dk, lp.v, dv)
	return lp.x.MustGrad(false)
}

// backwardWith runs backward from y with the gradient g: the backward of Σ(y ∘ g).
func backwardWith(g, y *ts.Tensor) {
	y.MustMul(g, false).MustSum(gotch.Invalid, true).MustBackward()
}

// backwardWith3 is backwardWith for three outputs of one graph at once.
func backwardWith3(a, ga, b, gb, c, gc *ts.Tensor) {
	s := a.MustMul(ga, false).MustSum(gotch.Invalid, true)
	s = s.MustAdd(b.MustMul(gb, false).MustSum(gotch.Invalid, true), true)
	s = s.MustAdd(c.MustMul(gc, false).MustSum(gotch.Invalid, true), true)
	s.MustBackward()
}

// TrainScore is Score for training (gradients on): the log-probs (and, withEntropy, entropies)
// of the sequences' response tokens, in one forward of all of them (right-padded), as leaves that
// require grad, and the Backprop that completes the gradient of a loss built on them. checkpoint
// recomputes each decoder layer in backward instead of keeping its activations (a mixture of
// experts recomputed with the experts its forward used).
//
// For a mixture-of-experts model the Scores also hold RouterAux, the router's load-balancing loss
// (a leaf: add it to the loss to train the router towards balance, or leave it out), and the
// sequences' Routes are compared or replayed as in Score.
//
// Call it and Backward on the torch thread, in one torch scope, with grad mode on.
func (m *Model) TrainScore(seqs []Sequence, withEntropy, checkpoint bool) (Scores, *Backprop, error) {
	if err := m.checkSeqs(seqs); err != nil {
		return Scores{}, nil, err
	}
	return m.trainScore(newScoreBatch(seqs, 0, m), seqs, withEntropy, checkpoint)
}

// trainScore is TrainScore on a laid-out batch of seqs (one sequence a row, or packed rows).
//
// A sharded model (units.go) runs it as a training pass: the root is gathered first and kept for
// the backward, each layer gathered around its forward, which keeps only the layer's input (the
// backward recomputes it, as with checkpointing).
func (m *Model) trainScore(batch *scoreBatch, seqs []Sequence, withEntropy, checkpoint bool) (Scores, *Backprop, error) {
	u := m.units()
	b := &Backprop{m: m, checkpoint: checkpoint, recompute: checkpoint || u != nil}
	if u != nil {
		u.Begin(PassTrain)
		defer u.End()
		u.Gather(m.RootUnit())
	}
	var x *ts.Tensor
	b.p, b.emb = m.embed(batch.ids, batch.pos, nil, nil, batch.maxPos)
	b.p.seg = batch.seg
	rt := batch.routing(m, seqs, b.recompute, true)
	b.p.moe = rt
	x = b.emb.MustDetach(false)
	for i, l := range m.Layers {
		b.p.layer = i
		if b.recompute { // keep the input, run the layer without keeping a graph
			b.inputs = append(b.inputs, x)
			m.gather(i)
			x = b.forwardKept(l, x)
			m.release(i)
			continue
		}
		lp := &layerPass{}
		s := torch.NewScope()
		lp.run(l, x, b.p)
		s.Keep(lp.tensors()...)
		s.Close()
		b.saved = append(b.saved, lp)
		x = lp.y.MustDetach(false)
	}
	b.last = x.MustSetRequiresGrad(true, true)
	routes := batch.finishRouting(rt, seqs)
	if rt != nil {
		rt.force = b.recompute // the recomputation takes the experts the forward used
	}
	h := m.Norm.forward(b.last, b.p)
	b.sel = batch.responseStates(h) // [N, hidden]
	h.MustDrop()
	b.selLeaf = b.sel.MustDetach(false)
	b.targets, b.mask, b.rows = batch.targets, batch.flatMask, batch.rows
	var lp, ent *ts.Tensor
	_ = torch.NoGrad(func() error {
		lp, ent = m.headScores(b.selLeaf, b.targets, b.rows, withEntropy)
		return nil
	})
	b.selLeaf = b.selLeaf.MustSetRequiresGrad(true, true)
	sc := Scores{Mask: batch.mask, Routes: routes}
	b.lp = leaf(lp.MustMul(batch.flatMask, true).MustView([]int64{batch.b, batch.R}, true))
	sc.LogProbs = b.lp
	if rt != nil && rt.real != nil {
		var loss *ts.Tensor
		loss, b.auxGrad = rt.auxLoss(m.opts.MoE.SparseLayers())
		b.aux = leaf(loss)
		sc.RouterAux = b.aux
	}
	if withEntropy {
		b.ent = leaf(ent.MustMul(batch.flatMask, true).MustView([]int64{batch.b, batch.R}, true))
		sc.Entropy = b.ent
	}
	return sc, b, nil
}

// forwardKept runs layer l on x for a backward that recomputes it, keeping nothing but the output:
// with checkpointing without a graph; sharded without checkpointing as the forward that keeps its
// graph runs it (the same values), its graph dropped at once.
func (b *Backprop) forwardKept(l layer, x *ts.Tensor) *ts.Tensor {
	s := torch.NewScope()
	defer s.Close()
	var y *ts.Tensor
	if b.checkpoint {
		_ = torch.NoGrad(func() error {
			y = forwardLayer(l, x, b.p)
			return nil
		})
	} else {
		lp := &layerPass{}
		lp.run(l, x, b.p)
		y = lp.y.MustDetach(false)
	}
	s.Keep(y)
	return y
}

// Backward adds the gradient of loss (a scalar built on the Scores TrainScore returned) to the
// model's parameters. It can be called once.
func (b *Backprop) Backward(loss *ts.Tensor) {
	if b.done {
		panic("policy: Backprop.Backward called twice")
	}
	b.done = true
	m := b.m
	if u := m.units(); u != nil { // a backward pass over the units; End completes one cut short
		root := m.RootUnit()
		u.Begin(PassBackward)
		defer func() {
			u.Release(root)
			u.End()
		}()
	}
	loss.MustBackward()
	b.headBackward()
	// The load-balancing loss: each layer's share of its gradient is added with the layer's.
	var auxGrad *ts.Tensor
	if g := gradOrNil(b.aux); g != nil {
		auxGrad = b.auxGrad.MustMul(g, false)
	}
	// The final norm and the selection of the response positions.
	gsel := gradOrNil(b.selLeaf)
	var g *ts.Tensor
	switch {
	case gsel != nil:
		backwardWith(gsel, b.sel)
		b.sel.MustDrop()
		g = b.last.MustGrad(false)
	case auxGrad != nil: // the loss depends on the load-balancing loss alone
		g = b.last.MustZerosLike(false)
	default: // the loss does not depend on the scores: no gradient to add
		return
	}
	// The layers, from the last.
	for i := len(m.Layers) - 1; i >= 0; i-- {
		g = b.layerBackward(i, g, auxGrad)
	}
	if b.emb.MustRequiresGrad() { // a frozen base (adapters training) has no embedding gradient
		backwardWith(g, b.emb)
	}
	g.MustDrop()
	b.emb.MustDrop()
	if u := m.units(); u != nil {
		u.Reduce(m.RootUnit())
	}
}

// layerBackward takes layer i's backward (recomputed from its input when b.recompute) for the
// gradient g of its output and returns the gradient of its input; a sharded layer is gathered
// around it and its gradients handed over as the backward leaves it.
func (b *Backprop) layerBackward(i int, g, auxGrad *ts.Tensor) *ts.Tensor {
	m, p := b.m, b.p
	p.layer = i
	m.gather(i)
	s := torch.NewScope()
	var lp *layerPass
	if b.recompute {
		lp = &layerPass{}
		lp.run(m.Layers[i], b.inputs[i], p)
	} else {
		lp = b.saved[i]
	}
	next := lp.backward(g, auxGrad, p)
	s.Keep(next)
	s.Close()
	for _, t := range append(lp.tensors(), g) {
		t.MustDrop()
	}
	if b.recompute {
		b.inputs[i].MustDrop()
	}
	if u := m.units(); u != nil {
		u.Reduce(i)
	}
	m.release(i)
	return next
}

// headBackward takes lm_head's backward, chunk by chunk, each chunk's logits recomputed with their
// graph, for the gradients the loss gave the scores handed out.
func (b *Backprop) headBackward() {
	// The scores handed out are masked (0 past a response's end): so are their gradients.
	dlp, dent := maskedGrad(b.lp, b.mask), maskedGrad(b.ent, b.mask)
	if dlp == nil && dent == nil {
		return
	}
	N := b.selLeaf.MustSize()[0]
	n := logitsChunk(b.m.opts.Vocab, N)
	for lo := int64(0); lo < N; lo += n {
		rows := min(n, N-lo)
		s := torch.NewScope()
		lp, ent := b.m.headChunk(b.selLeaf.MustNarrow(0, lo, rows, false), b.targets.MustNarrow(0, lo, rows, false), b.rows.MustNarrow(0, lo, rows, false), dent != nil)
		var total *ts.Tensor
		if dlp != nil {
			total = lp.MustMul(dlp.MustNarrow(0, lo, rows, false), true).MustSum(gotch.Invalid, true)
		}
		if dent != nil {
			t := ent.MustMul(dent.MustNarrow(0, lo, rows, false), true).MustSum(gotch.Invalid, true)
			if total == nil {
				total = t
			} else {
				total = total.MustAdd(t, true)
			}
		}
		total.MustBackward()
		s.Close()
	}
}

// maskedGrad is the gradient of the scores t [b, R] as [b·R], times mask; nil when t is nil or
// the loss did not depend on it.
func maskedGrad(t, mask *ts.Tensor) *ts.Tensor {
	g := gradOrNil(t)
	if g == nil {
		return nil
	}
	return g.MustView([]int64{-1}, true).MustMul(mask, true)
}

// leaf is t as a new leaf that requires grad (t is consumed).
func leaf(t *ts.Tensor) *ts.Tensor {
	return t.MustDetach(true).MustSetRequiresGrad(true, true)
}

// gradOrNil is t's gradient, or nil when t is nil or the loss did not depend on it.
func gradOrNil(t *ts.Tensor) *ts.Tensor {
	if t == nil {
		return nil
	}
	g := t.MustGrad(false)
	if !g.MustDefined() {
		return nil
	}
	return g
}

// headScores is lm_head on the hidden states h [N, hidden] of the batch rows seqs [N] (the
// sequence each belongs to, for per-row adapters): the log-prob of each target [N] and,
// withEntropy, the entropy of each position's distribution, in the compute dtype, one chunk of
// logits at a time (logitsChunk). Under grad mode autograd keeps every chunk's logits: training
// takes them chunk by chunk in Backprop.Backward instead.
func (m *Model) headScores(h, targets, seqs *ts.Tensor, withEntropy bool) (lp, ent *ts.Tensor) {
	N := h.MustSize()[0]
	n := logitsChunk(m.opts.Vocab, N)
	if n >= N {
		return m.headChunk(h, targets, seqs, withEntropy)
	}
	var lps, ents []*ts.Tensor
	for lo := int64(0); lo < N; lo += n {
		rows := min(n, N-lo)
		s := torch.NewScope()
		l, e := m.headChunk(h.MustNarrow(0, lo, rows, false), targets.MustNarrow(0, lo, rows, false), seqs.MustNarrow(0, lo, rows, false), withEntropy)
		s.Keep(l)
		lps = append(lps, l)
		if e != nil {
			s.Keep(e)
			ents = append(ents, e)
		}
		s.Close()
	}
	lp = ts.MustCat(lps, 0)
	if withEntropy {
		ent = ts.MustCat(ents, 0)
	}
	for _, t := range append(lps, ents...) {
		t.MustDrop()
	}
	return lp, ent
}

// headChunk is headScores on one chunk.
func (m *Model) headChunk(h, targets, rows *ts.Tensor, withEntropy bool) (lp, ent *ts.Tensor) {
	N := h.MustSize()[0]
	logits := m.logitsOf(h, rows) // [N, vocab]
	lse := logits.MustLogsumexp([]int64{-1}, false, false)
	lp = logits.MustGather(1, targets.MustView([]int64{N, 1}, false), false, false).MustSqueezeDim(1, true).MustSub(lse, true)
	if withEntropy {
		// H = logsumexp(z) − Σ softmax(z)·z
		probs := logits.MustSoftmax(-1, gotch.Invalid, false)
		expect := probs.MustMul(logits, true).MustSumDimIntlist([]int64{-1}, false, gotch.Invalid, true)
		ent = lse.MustSub(expect, true)
	} else {
		lse.MustDrop()
	}
	logits.MustDrop()
	return lp, ent
}
