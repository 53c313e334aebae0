package policy

// The mixture-of-experts MLP of the sparse layers (arch.MoE; transformers' Qwen3MoeSparseMoeBlock,
// modeling_qwen3_moe.py): a router picks each token's top-k experts, and the token's output is the
// sum of those experts' outputs weighted by the picked probabilities.
//
// Tokens are grouped by expert: the (token, expert) pairs are sorted by expert, each expert
// multiplies the tokens routed to it in one product, and the weighted outputs are added back to
// their tokens (index_add), so a token costs top-k experts, never all of them. The same code runs
// training (its backward too, in pieces and under checkpointing), scoring, generation (prefill and
// decoding, continuous batching's live rows) and LoRA (adapters on the experts' projections), on
// the CPU and on CUDA. The routing itself (live, recorded or replayed) is routing.go's.

import (
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// sparseMLP is a sparse layer's MLP (mlp): the router mlp.gate [experts, hidden] (no bias) and the
// experts mlp.experts.{j}, SwiGLU MLPs of moe_intermediate_size features.
type sparseMLP struct {
	Gate    Linear     `hf:"gate"`
	Experts expertList `hf:"experts"`
	topK    int64
	norm    bool // norm_topk_prob: the picked probabilities renormalized to sum to one
}

// expertList is the experts of a sparse MLP; its weights are named experts.{j}.…
type expertList struct{ list []*mlp }

func (e *expertList) weights(prefix string, out *[]slot) {
	for j, x := range e.list {
		collect(fmt.Sprintf("%s%d.", prefix, j), x, out)
	}
}

// newSparseMLP is the mixture of experts o.MoE describes; expert j's projections follow the
// attention's among the layer's projections, three each.
func newSparseMLP(o *options) *sparseMLP {
	s := &sparseMLP{Gate: newLinear(o.Hidden, o.MoE.Experts, false), topK: o.MoE.TopK, norm: o.MoE.NormTopK}
	for j := range int(o.MoE.Experts) {
		s.Experts.list = append(s.Experts.list, newMLP(o, o.MoE.Inter, modMLP+3*j))
	}
	return s
}

// forward maps x [B, T, hidden] to the sum over each token's top-k experts of their outputs
// weighted by the router's probabilities.
func (s *sparseMLP) forward(x *ts.Tensor, p *pass) *ts.Tensor {
	size := x.MustSize()
	flat := x.MustReshape([]int64{-1, size[len(size)-1]}, false) // [N, hidden]
	idx, w := s.route(s.Gate.forward(flat), p)
	return s.dispatch(flat, idx, w, p, size[1]).MustView(size, true)
}

// route picks each token's experts from the router's logits [N, experts]: idx [N, k] (int64) and
// their weights w [N, k] in the logits' dtype. The probabilities are the softmax of the logits in
// float32 (float64 for a float64 model), as transformers computes them; the top k are picked
// (or the ones routing.go replays, their weights gathered from the same probabilities) and, with
// norm_topk_prob, renormalized to sum to one.
func (s *sparseMLP) route(logits *ts.Tensor, p *pass) (idx, w *ts.Tensor) {
	probs := logits.MustSoftmax(-1, p.m.compute, false)
	r := p.moe
	var live *ts.Tensor // the router's own picks (none in a recomputation)
	if r != nil && r.force {
		idx = r.usedAt(p.layer)
		w = probs.MustGather(1, idx, false, false)
	} else {
		w, live = probs.MustTopk(s.topK, -1, true, true, false)
		idx = live
		if r != nil {
			idx, w = r.apply(p.layer, probs, live, w)
		}
	}
	if r != nil && r.real != nil {
		r.aux(p.layer, probs, live)
	}
	if s.norm {
		w = w.MustDiv(w.MustSumDimIntlist([]int64{-1}, true, gotch.Invalid, false), true)
	}
	return idx, cast(w, logits.DType())
}

// dispatch runs each token of flat [N, hidden] through its experts idx [N, k] and adds their
// outputs, weighted by w [N, k], back to it: the (token, expert) pairs sorted by expert (stably:
// each expert's tokens in order), one product per expert over its tokens, one index_add. T is the
// tokens per batch row (token n is row n / T's, for per-row adapters).
func (s *sparseMLP) dispatch(flat, idx, w *ts.Tensor, p *pass, T int64) *ts.Tensor {
	size := flat.MustSize()
	flatIdx := idx.MustReshape([]int64{-1}, false)
	_, order := flatIdx.MustSortStable(true, 0, false, false)
	counts := flatIdx.MustBincount(ts.None, int64(len(s.Experts.list)), false).Int64Values() // one transfer per layer
	tok := order.MustDivScalarMode(ts.IntScalar(s.topK), "floor", false)                     // the token of each pair
	xs := flat.MustIndexSelect(0, tok, false)
	ws := w.MustReshape([]int64{-1}, false).MustIndexSelect(0, order, true).MustUnsqueeze(1, true)
	var rows *ts.Tensor
	if p.lora != nil && p.lora.uniform < 0 {
		rows = tok.MustDivScalarMode(ts.IntScalar(T), "floor", false)
	}
	var ys []*ts.Tensor
	var off int64
	for j, n := range counts {
		if n == 0 {
			continue
		}
		var r *ts.Tensor
		if rows != nil {
			r = rows.MustNarrow(0, off, n, false)
		}
		ys = append(ys, s.Experts.list[j].run(xs.MustNarrow(0, off, n, false), p, r))
		off += n
	}
	y := ts.MustCat(ys, 0).MustMul(ws, true)
	return ts.MustZeros(size, flat.DType(), flat.MustDevice()).MustIndexAdd(0, tok, y, true)
}

func (s *sparseMLP) packed() ffn {
	c := *s
	c.Gate = packLinear(&s.Gate)
	c.Experts.list = make([]*mlp, len(s.Experts.list))
	for j, e := range s.Experts.list {
		c.Experts.list[j] = e.packed().(*mlp)
	}
	return &c
}

// projections are every expert's gate_proj, up_proj and down_proj (mlp.experts.{j}.…), expert by
// expert; the router is not among them (all-linear adapts the experts, not the router).
func (s *sparseMLP) projections() []projection {
	var out []projection
	for j, e := range s.Experts.list {
		out = append(out, e.projectionsAt(fmt.Sprintf("mlp.experts.%d.", j))...)
	}
	return out
}
