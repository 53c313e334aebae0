package policy

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// packSeqs are sequences of different lengths for the packing tests (their prompts and responses
// cross tile boundaries and Mistral's window of 5).
func packSeqs() []Sequence {
	rng := rand.New(rand.NewPCG(7, 8))
	seqs := make([]Sequence, 4)
	for i, n := range [][2]int{{5, 9}, {3, 2}, {8, 6}, {2, 11}} {
		for range n[0] {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(48))
		}
		for range n[1] {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(48))
		}
	}
	return seqs
}

// packCases are the layouts the packing tests try: one row of all (in an order of their own), and
// two rows of two.
var packCases = [][][]int{nil, {{2, 0, 3, 1}}, {{1, 3}, {2, 0}}}

// checkPacked compares TrainScorePacked (and ScorePacked) of m on seqs, for every layout in
// packCases, with and without checkpointing, over whole and small tiles, against each sequence
// scored alone: log-probs, entropies and the gradients of every parameter grads reads.
func checkPacked(m *Model, seqs []Sequence, params func() map[string][]float64) error {
	R := int64(0)
	for _, s := range seqs {
		R = max(R, int64(len(s.ResponseIDs)))
	}
	b := int64(len(seqs))
	w := ts.MustRandn([]int64{b, R}, gotch.Double, gotch.CPU)
	u := ts.MustRandn([]int64{b, R}, gotch.Double, gotch.CPU)
	want, err := m.Score(seqs, true, 1) // each sequence alone
	if err != nil {
		return err
	}
	gradLoss(want, w, u).MustBackward()
	ref := params()
	if len(ref) == 0 {
		return fmt.Errorf("no parameter has a gradient")
	}
	wantLP, wantEnt := values(want.LogProbs), values(want.Entropy)
	for _, rows := range packCases {
		for _, c := range []struct {
			checkpoint bool
			tile       int64
		}{{false, 0}, {true, 0}, {false, 3}, {true, 2}} {
			err := func() error {
				if c.tile > 0 {
					defer smallTiles(c.tile)()
				}
				s := torch.NewScope()
				defer s.Close()
				got, err := torch.Scoped(func() ([]*ts.Tensor, error) {
					sc, err := m.ScorePacked(seqs, rows, true)
					return []*ts.Tensor{sc.LogProbs, sc.Entropy}, err
				})
				if err != nil {
					return err
				}
				if d := maxDiff(values(got[0]), wantLP); d > 1e-10 {
					return fmt.Errorf("rows %v, %+v: ScorePacked's log-probs differ by %.3g", rows, c, d)
				}
				sc, bp, err := m.TrainScorePacked(seqs, rows, true, c.checkpoint)
				if err != nil {
					return err
				}
				if d := maxDiff(values(sc.LogProbs), wantLP); d > 1e-10 {
					return fmt.Errorf("rows %v, %+v: log-probs differ by %.3g", rows, c, d)
				}
				if d := maxDiff(values(sc.Entropy), wantEnt); d > 1e-10 {
					return fmt.Errorf("rows %v, %+v: entropies differ by %.3g", rows, c, d)
				}
				bp.Backward(gradLoss(sc, w, u))
				gotG := params()
				if len(gotG) != len(ref) {
					return fmt.Errorf("rows %v, %+v: %d parameters have a gradient, alone %d", rows, c, len(gotG), len(ref))
				}
				var bad []string
				for k, g := range ref {
					if d := maxDiff(gotG[k], g); d > 1e-9*(1+maxAbs(g)) {
						bad = append(bad, fmt.Sprintf("%s: by %.3g (scale %.3g)", k, d, maxAbs(g)))
					}
				}
				if len(bad) > 0 {
					sort.Strings(bad)
					return fmt.Errorf("rows %v, %+v: gradients differ from the sequences' alone:\n%s", rows, c, strings.Join(bad, "\n"))
				}
				return nil
			}()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// Sequences packed several to a row (block-diagonal causal mask, positions restarting per
// sequence) give each sequence's log-probs, entropies and gradients alone, for every family (Mistral's
// window inside a packed row), with and without checkpointing, over tiles that span sequences, in
// float64.
func TestPackedRowsMatchAlone(t *testing.T) {
	seqs := packSeqs()
	for _, name := range arch.ModelTypes() {
		t.Run(name, func(t *testing.T) {
			m := randomModel(t, name, 48, gotch.Double, 0.2, 5)
			onTorch(t, func() error { return checkPacked(m, seqs, func() map[string][]float64 { return grads(m) }) })
		})
	}
}

// The same for a LoRA adapter's view on a frozen base: the adapter's gradients.
func TestPackedRowsMatchAloneLoRA(t *testing.T) {
	seqs := packSeqs()
	m := randomModel(t, arch.Qwen2, 48, gotch.Double, 0.2, 5)
	a := testAdapter(t, m, "a", loraA, gotch.Double, 1, 0.2)
	onTorch(t, func() error {
		m.Freeze()
		defer m.Thaw()
		v := view(t, m, []*Adapter{a}, nil)
		return checkPacked(v, seqs, func() map[string][]float64 { return grads(v) })
	})
}

// A view whose adapters differ by row is refused.
func TestPackedRowsRefuseMixedAdapters(t *testing.T) {
	m := randomModel(t, arch.Llama, 48, gotch.Double, 0.2, 5)
	a := testAdapter(t, m, "a", loraA, gotch.Double, 1, 0.2)
	onTorch(t, func() error {
		v := view(t, m, []*Adapter{a}, []int{0, -1, 0, 0})
		if _, _, err := v.TrainScorePacked(packSeqs(), nil, false, false); err == nil {
			return fmt.Errorf("packed rows of mixed adapters accepted")
		}
		return nil
	})
}
