package policy

import (
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// Sequence is one prompt and the response whose tokens are scored.
type Sequence struct {
	PromptIDs, ResponseIDs []int

	// For a mixture-of-experts model only (routing.go; an error on a dense one):
	//
	// Routes are the experts the sequence's tokens were routed to when it was sampled (an
	// engine's routed experts, Routes.From on; the tokens they do not cover route live). The pass
	// compares its own routing with them (Scores.Routes) and, with Replay, routes those tokens to
	// them, the gate weights recomputed from its own router's probabilities, so that the log-probs
	// are those of the sampling routing and the router still learns.
	Routes *Routes
	Replay bool
	// Record, when set, receives the experts this pass routed every token of the sequence to
	// (prompt and response).
	Record *Routes
}

// Scores are per-response-token figures, [B, Rmax] each (Rmax the longest response), float32
// (float64 for a float64 model), on the model's device. Row b, column j is response token j of
// sequence b; Mask is 1 there and 0 past the end of the response, where LogProbs and Entropy are 0.
type Scores struct {
	LogProbs *ts.Tensor // log p(response token j | prompt, response tokens < j)
	Entropy  *ts.Tensor // entropy of the model's distribution at that position; nil unless asked
	Mask     *ts.Tensor

	// RouterAux is a mixture-of-experts model's load-balancing loss over the batch's tokens
	// (transformers' load_balancing_loss_func, the padding masked out): a scalar leaf that requires
	// grad, which the trainer adds to its loss times router_aux_loss_coef
	// (arch.MoE.AuxLossCoef) if it wants the router balanced. TrainScore only; nil otherwise.
	RouterAux *ts.Tensor
	// Routes compares the pass's routing with the sequences' Routes; nil when none were given.
	Routes *RouteStats
}

// Score computes the log-probs (and, withEntropy, the entropies) of each sequence's response tokens
// given its prompt, with temperature 1 and no filtering, MicroBatch sequences per forward. See
// Model.Score.
func (p *Policy) Score(seqs []Sequence, withEntropy bool) (Scores, error) {
	return p.Model.Score(seqs, withEntropy, p.MicroBatch)
}

// Score computes the log-probs (and, withEntropy, the entropies) of each sequence's response tokens
// given its prompt, microBatch sequences per forward (0: all at once). Sequences are right-padded,
// so plain causal attention is exact for every real token; only the hidden states that predict
// response tokens go through lm_head, one chunk of logits at a time.
//
// Gradients flow to the model's parameters when grad mode is on, through autograd, which keeps
// every layer's activations: training takes TrainScore instead. The caller chooses, wrapping the
// call in torch.NoGrad for old and reference log-probs. The results belong to the caller's current
// torch scope; everything else is freed (or left to autograd) before Score returns. Call it on the
// torch thread (inside torch.Do).
func (m *Model) Score(seqs []Sequence, withEntropy bool, microBatch int) (Scores, error) {
	if err := m.checkSeqs(seqs); err != nil {
		return Scores{}, err
	}
	rmax := 0
	for _, s := range seqs {
		rmax = max(rmax, len(s.ResponseIDs))
	}
	if microBatch <= 0 {
		microBatch = len(seqs)
	}
	var parts [][]*ts.Tensor
	var routes *RouteStats
	for start := 0; start < len(seqs); start += microBatch {
		chunk := seqs[start:min(start+microBatch, len(seqs))]
		out, err := torch.Scoped(func() ([]*ts.Tensor, error) {
			lp, ent, mask, st := m.withRows(start, start+len(chunk)).scoreChunk(chunk, rmax, withEntropy)
			if st != nil {
				if routes == nil {
					routes = &RouteStats{}
				}
				routes.Add(st)
			}
			if ent == nil {
				return []*ts.Tensor{lp, mask}, nil
			}
			return []*ts.Tensor{lp, mask, ent}, nil
		})
		if err != nil {
			return Scores{}, err
		}
		parts = append(parts, out)
	}
	if len(parts) == 1 {
		sc := Scores{LogProbs: parts[0][0], Mask: parts[0][1], Routes: routes}
		if withEntropy {
			sc.Entropy = parts[0][2]
		}
		return sc, nil
	}
	out, _ := torch.Scoped(func() ([]*ts.Tensor, error) {
		var res []*ts.Tensor
		for k := range parts[0] {
			var col []*ts.Tensor
			for _, p := range parts {
				col = append(col, p[k])
			}
			res = append(res, ts.MustCat(col, 0))
		}
		for _, p := range parts {
			for _, t := range p {
				t.MustDrop()
			}
		}
		return res, nil
	})
	sc := Scores{LogProbs: out[0], Mask: out[1], Routes: routes}
	if withEntropy {
		sc.Entropy = out[2]
	}
	return sc, nil
}

// scoreChunk scores a few sequences together: [b, rmax] log-probs, entropies (or nil) and mask,
// and the routing's comparison with the sequences' routes (nil: none given).
func (m *Model) scoreChunk(seqs []Sequence, rmax int, withEntropy bool) (lp, ent, mask *ts.Tensor, routes *RouteStats) {
	sb := newScoreBatch(seqs, rmax, m)
	rt := sb.routing(m, seqs, false, false)
	defer m.forwardPass()()
	h := m.hidden(sb.ids, nil, nil, nil, sb.L-1, rt) // [b, L, hidden]
	routes = sb.finishRouting(rt, seqs)
	flat, e := m.headScores(sb.responseStates(h), sb.targets, sb.rows, withEntropy)
	shape := []int64{sb.b, sb.R}
	lp = flat.MustMul(sb.flatMask, true).MustView(shape, true)
	if withEntropy {
		ent = e.MustMul(sb.flatMask, true).MustView(shape, true)
	}
	return lp, ent, sb.mask, routes
}
