package policy

// Packed rows: several sequences one after the other in one row of a training (or scoring)
// forward, instead of one right-padded sequence a row. Each sequence's positions restart at 0 and
// a query sees only the keys of its own sequence (a block-diagonal causal mask: attnSpec.seg), so
// every token's log-prob and every gradient are those of the sequence alone; only the padding
// changes (none inside a row, a row's tail up to the longest row).
//
// The attention's tiles skip the keys before the sequence of their first query (attnSpec.keys), so
// a row of sequences of lengths Lᵢ costs about Σ Lᵢ²/2 scores, not (Σ Lᵢ)²/2, and a tile whose
// queries all belong to one sequence takes plain causal masking. libtorch's fused kernel has no
// such mask (libtorch 1.13 has no fused kernel at all): packed rows always take the tiles.

import (
	"fmt"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// TrainScorePacked is TrainScore with the sequences packed into rows: rows[r] lists the indices of
// the sequences of row r, in order (every sequence in exactly one row); nil puts them all in one
// row. The Scores are laid out as TrainScore's, one row per sequence ([len(seqs), longest
// response]), and equal them up to float rounding; Backward is the same. A view whose adapters
// differ by row cannot be packed.
func (m *Model) TrainScorePacked(seqs []Sequence, rows [][]int, withEntropy, checkpoint bool) (Scores, *Backprop, error) {
	sb, err := m.packedBatch(seqs, rows)
	if err != nil {
		return Scores{}, nil, err
	}
	return m.trainScore(sb, seqs, withEntropy, checkpoint)
}

// ScorePacked is Score (one forward, no micro-batches) with the sequences packed into rows as in
// TrainScorePacked; gradients flow through autograd when grad mode is on.
func (m *Model) ScorePacked(seqs []Sequence, rows [][]int, withEntropy bool) (Scores, error) {
	sb, err := m.packedBatch(seqs, rows)
	if err != nil {
		return Scores{}, err
	}
	defer m.forwardPass()()
	p, x := m.embed(sb.ids, sb.pos, nil, nil, sb.maxPos)
	p.seg = sb.seg
	rt := sb.routing(m, seqs, false, false)
	p.moe = rt
	x = m.runLayers(x, p)
	h := step(x, func(x *ts.Tensor) *ts.Tensor { return m.Norm.forward(x, p) })
	lp, ent := m.headScores(sb.responseStates(h), sb.targets, sb.rows, withEntropy)
	shape := []int64{sb.b, sb.R}
	sc := Scores{LogProbs: lp.MustMul(sb.flatMask, true).MustView(shape, true), Mask: sb.mask, Routes: sb.finishRouting(rt, seqs)}
	if withEntropy {
		sc.Entropy = ent.MustMul(sb.flatMask, true).MustView(shape, true)
	}
	return sc, nil
}

// packedBatch lays seqs out in the given rows (nil: one row of all): ids, positions restarting with
// each sequence, the sequences' extents, and for each response token the column that predicts it.
func (m *Model) packedBatch(seqs []Sequence, rows [][]int) (*scoreBatch, error) {
	if err := m.checkSeqs(seqs); err != nil {
		return nil, err
	}
	if m.lora != nil && m.lora.rows != nil {
		return nil, fmt.Errorf("score: packed rows on a view whose adapters differ by row")
	}
	if rows == nil {
		all := make([]int, len(seqs))
		for i := range all {
			all[i] = i
		}
		rows = [][]int{all}
	}
	seen := make([]bool, len(seqs))
	var L, R, longest int64
	lens := make([][]int, len(rows))
	for r, idx := range rows {
		var w int64
		for _, i := range idx {
			if i < 0 || i >= len(seqs) || seen[i] {
				return nil, fmt.Errorf("score: packed rows: sequence %d missing from the sequences or in two rows", i)
			}
			seen[i] = true
			n := len(seqs[i].PromptIDs) + len(seqs[i].ResponseIDs)
			lens[r] = append(lens[r], n)
			w += int64(n)
			R, longest = max(R, int64(len(seqs[i].ResponseIDs))), max(longest, int64(n))
		}
		L = max(L, w)
	}
	for i, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("score: packed rows: sequence %d in no row", i)
		}
	}
	b, n := int64(len(seqs)), int64(len(rows))
	ids := make([]int64, n*L)
	pos := make([]int64, n*L)
	at := make([]int64, b*R)
	targets := make([]int64, b*R)
	maskV := make([]float32, b*R)
	rowOf := make([]int64, b*R)
	for r, idx := range rows {
		col := int64(r) * L
		for _, i := range idx {
			s := seqs[i]
			P := int64(len(s.PromptIDs))
			for j, id := range append(s.PromptIDs[:P:P], s.ResponseIDs...) {
				ids[col+int64(j)], pos[col+int64(j)] = int64(id), int64(j)
			}
			for j := range R {
				rowOf[int64(i)*R+j] = int64(r)
			}
			for j, id := range s.ResponseIDs {
				k := int64(i)*R + int64(j)
				at[k], targets[k], maskV[k] = col+P+int64(j)-1, int64(id), 1
			}
			col += P + int64(len(s.ResponseIDs))
		}
	}
	sb := &scoreBatch{b: b, L: L, R: R, n: n, maxPos: longest - 1}
	if m.isMoE() {
		sb.placePacked(seqs, rows)
	}
	dev := m.device
	_ = torch.NoGrad(func() error {
		sb.ids = ts.MustOfSlice(ids).MustTo(dev, true).MustView([]int64{n, L}, true)
		sb.pos = ts.MustOfSlice(pos).MustTo(dev, true).MustView([]int64{n, L}, true)
		sb.at = ts.MustOfSlice(at).MustTo(dev, true)
		sb.targets = ts.MustOfSlice(targets).MustTo(dev, true)
		sb.rows = ts.MustOfSlice(rowOf).MustTo(dev, true)
		sb.flatMask = ts.MustOfSlice(maskV).MustTotype(m.compute, true).MustTo(dev, true)
		sb.mask = sb.flatMask.MustView([]int64{b, R}, false)
		sb.seg = newSegments(lens, L, dev)
		return nil
	})
	return sb, nil
}

// placePacked makes seqAt and posAt (a mixture of experts' routing) for seqs packed in rows.
func (sb *scoreBatch) placePacked(seqs []Sequence, rows [][]int) {
	sb.places()
	for r, idx := range rows {
		col := int64(r) * sb.L
		for _, i := range idx {
			w := int64(len(seqs[i].PromptIDs) + len(seqs[i].ResponseIDs))
			for j := range w {
				sb.seqAt[col+j], sb.posAt[col+j] = int32(i), int32(j)
			}
			col += w
		}
	}
}
