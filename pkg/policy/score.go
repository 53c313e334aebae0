package policy

import (
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// Sequence is one prompt and the response whose tokens are scored.
type Sequence struct {
	PromptIDs, ResponseIDs []int
}

// Scores are per-response-token figures, [B, Rmax] each (Rmax the longest response), float32
// (float64 for a float64 model), on the model's device. Row b, column j is response token j of
// sequence b; Mask is 1 there and 0 past the end of the response, where LogProbs and Entropy are 0.
type Scores struct {
	LogProbs *ts.Tensor // log p(response token j | prompt, response tokens < j)
	Entropy  *ts.Tensor // entropy of the model's distribution at that position; nil unless asked
	Mask     *ts.Tensor
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
// response tokens go through lm_head.
//
// Gradients flow to the model's parameters when grad mode is on: the caller chooses, wrapping the
// call in torch.NoGrad for old and reference log-probs. The results belong to the caller's current
// torch scope; everything else is freed (or left to autograd) before Score returns. Call it on the
// torch thread (inside torch.Do).
func (m *Model) Score(seqs []Sequence, withEntropy bool, microBatch int) (Scores, error) {
	if len(seqs) == 0 {
		return Scores{}, fmt.Errorf("score: no sequences")
	}
	rmax := 0
	for i, s := range seqs {
		if len(s.PromptIDs) == 0 {
			return Scores{}, fmt.Errorf("score: sequence %d: empty prompt", i)
		}
		for _, id := range append(s.PromptIDs[:len(s.PromptIDs):len(s.PromptIDs)], s.ResponseIDs...) {
			if id < 0 || id >= m.Config.VocabSize {
				return Scores{}, fmt.Errorf("score: sequence %d: token id %d outside the vocabulary [0, %d)", i, id, m.Config.VocabSize)
			}
		}
		rmax = max(rmax, len(s.ResponseIDs))
	}
	if microBatch <= 0 {
		microBatch = len(seqs)
	}
	var parts [][]*ts.Tensor
	for start := 0; start < len(seqs); start += microBatch {
		chunk := seqs[start:min(start+microBatch, len(seqs))]
		out, err := torch.Scoped(func() ([]*ts.Tensor, error) {
			lp, ent, mask := m.scoreChunk(chunk, rmax, withEntropy)
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
		sc := Scores{LogProbs: parts[0][0], Mask: parts[0][1]}
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
	sc := Scores{LogProbs: out[0], Mask: out[1]}
	if withEntropy {
		sc.Entropy = out[2]
	}
	return sc, nil
}

// scoreChunk scores a few sequences together: [b, rmax] log-probs, entropies (or nil) and mask.
func (m *Model) scoreChunk(seqs []Sequence, rmax int, withEntropy bool) (lp, ent, mask *ts.Tensor) {
	b := int64(len(seqs))
	L := 0
	for _, s := range seqs {
		L = max(L, len(s.PromptIDs)+len(s.ResponseIDs))
	}
	R := int64(rmax)
	ids := make([]int64, b*int64(L))
	at := make([]int64, b*R)      // which position's hidden state predicts response token j
	targets := make([]int64, b*R) // response token j
	maskV := make([]float64, b*R)
	for i, s := range seqs {
		row := ids[i*L : (i+1)*L]
		for j, id := range s.PromptIDs {
			row[j] = int64(id)
		}
		n := len(s.PromptIDs)
		for j, id := range s.ResponseIDs {
			row[n+j] = int64(id)
			at[int64(i)*R+int64(j)] = int64(n + j - 1)
			targets[int64(i)*R+int64(j)] = int64(id)
			maskV[int64(i)*R+int64(j)] = 1
		}
	}
	dev := m.device
	idsT := ts.MustOfSlice(ids).MustTo(dev, true).MustView([]int64{b, int64(L)}, true)
	h := m.hidden(idsT, nil, nil, nil, int64(L-1)) // [b, L, hidden]
	H := h.MustSize()[2]
	atT := ts.MustOfSlice(at).MustTo(dev, true).MustView([]int64{b, R, 1}, true).MustExpand([]int64{b, R, H}, false, true)
	logits := m.logits(h.MustGather(1, atT, false, true)) // [b, R, vocab]
	lse := logits.MustLogsumexp([]int64{-1}, false, false)
	tgt := ts.MustOfSlice(targets).MustTo(dev, true).MustView([]int64{b, R, 1}, true)
	mask = ts.MustOfSlice(maskV).MustTotype(m.compute, true).MustTo(dev, true).MustView([]int64{b, R}, true)
	lp = logits.MustGather(2, tgt, false, false).MustSqueezeDim(2, true).MustSub(lse, true).MustMul(mask, true)
	if withEntropy {
		// H = logsumexp(z) − Σ softmax(z)·z
		probs := logits.MustSoftmax(-1, gotch.Invalid, false)
		expect := probs.MustMul(logits, true).MustSumDimIntlist([]int64{-1}, false, gotch.Invalid, true)
		ent = lse.MustSub(expect, false).MustMul(mask, true)
	}
	return lp, ent, mask
}
