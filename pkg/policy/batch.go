package policy

// A batch of sequences laid out for one score or training forward.

import (
	"fmt"

	"github.com/sugarme/gotch/ts"
)

// scoreBatch is a few sequences laid out for one forward: right-padded ids, and for each response
// token the position whose hidden state predicts it.
type scoreBatch struct {
	b, L, R  int64
	n        int64      // rows of the forward: b, or fewer when sequences are packed (packrows.go)
	ids      *ts.Tensor // [n, L]
	pos      *ts.Tensor // [n, L] positions of packed rows; nil: 0 … L−1 in every row
	seg      *segments  // packed rows' sequences; nil: one sequence a row
	maxPos   int64      // the largest position
	at       *ts.Tensor // [b·R] flat index row·L + column into the [n·L] hidden states
	targets  *ts.Tensor // [b·R] response tokens (0 past a response's end)
	rows     *ts.Tensor // [b·R] the sequence of each: i for i·R … i·R+R−1
	mask     *ts.Tensor // [b, R] 1 on response tokens, compute dtype
	flatMask *ts.Tensor // mask as [b·R]
	// seqAt and posAt are, for a mixture-of-experts model, the sequence and the index in it of the
	// token in each of the n·L places (−1: padding); nil for a dense model.
	seqAt, posAt []int32
}

// newScoreBatch lays seqs out for m, with R at least width (the longest response otherwise).
func newScoreBatch(seqs []Sequence, width int, m *Model) *scoreBatch {
	b := int64(len(seqs))
	L, R := int64(0), int64(width)
	for _, s := range seqs {
		L = max(L, int64(len(s.PromptIDs)+len(s.ResponseIDs)))
		R = max(R, int64(len(s.ResponseIDs)))
	}
	ids := make([]int64, b*L)
	at := make([]int64, b*R)
	targets := make([]int64, b*R)
	maskV := make([]float32, b*R)
	rows := make([]int64, b*R)
	for i, s := range seqs {
		for j := range R {
			rows[int64(i)*R+j] = int64(i)
		}
		row := ids[int64(i)*L : int64(i+1)*L]
		for j, id := range s.PromptIDs {
			row[j] = int64(id)
		}
		n := int64(len(s.PromptIDs))
		for j, id := range s.ResponseIDs {
			row[n+int64(j)] = int64(id)
			k := int64(i)*R + int64(j)
			at[k] = int64(i)*L + n + int64(j) - 1
			targets[k] = int64(id)
			maskV[k] = 1
		}
	}
	sb := &scoreBatch{b: b, L: L, R: R, n: b, maxPos: L - 1}
	if m.isMoE() {
		sb.places()
		for i, s := range seqs {
			for j := range len(s.PromptIDs) + len(s.ResponseIDs) {
				sb.seqAt[int64(i)*L+int64(j)], sb.posAt[int64(i)*L+int64(j)] = int32(i), int32(j)
			}
		}
	}
	dev := m.device
	sb.ids = ts.MustOfSlice(ids).MustTo(dev, true).MustView([]int64{b, L}, true)
	sb.at = ts.MustOfSlice(at).MustTo(dev, true)
	sb.targets = ts.MustOfSlice(targets).MustTo(dev, true)
	sb.rows = ts.MustOfSlice(rows).MustTo(dev, true)
	sb.flatMask = ts.MustOfSlice(maskV).MustTotype(m.compute, true).MustTo(dev, true)
	sb.mask = sb.flatMask.MustView([]int64{b, R}, false)
	return sb
}

// responseStates picks the hidden states that predict response tokens: [b·R, hidden] from h [n, L, hidden].
func (sb *scoreBatch) responseStates(h *ts.Tensor) *ts.Tensor {
	H := h.MustSize()[2]
	return h.MustView([]int64{sb.n * sb.L, H}, false).MustIndexSelect(0, sb.at, true)
}

// checkSeqs refuses an empty batch, empty prompts and ids outside the vocabulary.
func (m *Model) checkSeqs(seqs []Sequence) error {
	if len(seqs) == 0 {
		return fmt.Errorf("score: no sequences")
	}
	for i, s := range seqs {
		if len(s.PromptIDs) == 0 {
			return fmt.Errorf("score: sequence %d: empty prompt", i)
		}
		for _, id := range append(s.PromptIDs[:len(s.PromptIDs):len(s.PromptIDs)], s.ResponseIDs...) {
			if id < 0 || id >= m.Config.VocabSize {
				return fmt.Errorf("score: sequence %d: token id %d outside the vocabulary [0, %d)", i, id, m.Config.VocabSize)
			}
		}
		if s.Routes != nil {
			if err := m.checkRoutes(s.Routes, len(s.PromptIDs)+len(s.ResponseIDs)); err != nil {
				return fmt.Errorf("score: sequence %d: %w", i, err)
			}
		}
		if s.Record != nil && !m.isMoE() {
			return fmt.Errorf("score: sequence %d: routes to record, but the model has no mixture-of-experts layers", i)
		}
	}
	return nil
}

// places makes seqAt and posAt for the batch's n·L places, all padding.
func (sb *scoreBatch) places() {
	sb.seqAt, sb.posAt = make([]int32, sb.n*sb.L), make([]int32, sb.n*sb.L)
	for i := range sb.seqAt {
		sb.seqAt[i], sb.posAt[i] = -1, -1
	}
}

// routing is the routing work of a forward of the batch of seqs (nil for a dense model): their
// routes given, compared or replayed, the experts kept when a sequence records them or keep is set,
// the load-balancing sums when aux is.
func (sb *scoreBatch) routing(m *Model, seqs []Sequence, keep, aux bool) *routing {
	if sb.seqAt == nil {
		return nil
	}
	toks := make([]routeToken, len(sb.seqAt))
	for k, i := range sb.seqAt {
		if i < 0 {
			continue
		}
		s := &seqs[i]
		toks[k] = routeToken{given: s.Routes, at: int(sb.posAt[k]), replay: s.Replay, real: true}
		keep = keep || s.Record != nil
	}
	return m.newRouting(toks, keep, aux)
}

// finishRouting hands each sequence that records its routes what the forward used, and returns the
// comparison with the given routes (nil: none given).
func (sb *scoreBatch) finishRouting(rt *routing, seqs []Sequence) *RouteStats {
	if rt == nil {
		return nil
	}
	if used := rt.usedValues(); used != nil {
		done := make([]bool, len(seqs))
		for k, i := range sb.seqAt {
			if i < 0 || done[i] || seqs[i].Record == nil {
				continue
			}
			done[i] = true // its first token: the others follow it
			s := seqs[i]
			*s.Record = rt.routesOf(used, k, 0, len(s.PromptIDs)+len(s.ResponseIDs))
		}
	}
	return rt.stats()
}
