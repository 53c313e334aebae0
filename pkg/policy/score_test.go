package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

func randomSequences(n, vocab int, seed uint64) []Sequence {
	rng := rand.New(rand.NewPCG(seed, 1))
	seqs := make([]Sequence, n)
	for i := range seqs {
		p, r := 1+rng.IntN(9), rng.IntN(8)
		if i == 0 {
			r = 8 // the longest response
		}
		for range p {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(vocab))
		}
		for range r {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(vocab))
		}
	}
	return seqs
}

// Score's log-probs and entropies equal those of a full forward of each sequence alone (float32,
// 1e-5), in one batch or in micro-batches; Mask marks the response tokens.
func TestScoreMatchesForward(t *testing.T) {
	for _, family := range arch.ModelTypes() {
		t.Run(family, func(t *testing.T) {
			m := randomModel(t, family, 97, gotch.Float, 0.2, 4)
			seqs := randomSequences(6, 97, 8)
			onTorch(t, func() error {
				return torch.NoGrad(func() error {
					for _, micro := range []int{0, 4, 1} {
						sc, err := m.Score(seqs, true, micro)
						if err != nil {
							return err
						}
						if got := sc.LogProbs.MustSize(); got[0] != 6 || got[1] != 8 {
							return fmt.Errorf("log-probs shape %v, want [6 8]", got)
						}
						lp, ent, mask := values(sc.LogProbs), values(sc.Entropy), values(sc.Mask)
						for i, s := range seqs {
							full := append(append([]int{}, s.PromptIDs...), s.ResponseIDs...)
							logp := m.Forward(idsTensor(full), nil, nil, nil).MustLogSoftmax(-1, gotch.Invalid, true)
							ref := values(logp)
							refEnt := values(logp.MustExp(false).MustMul(logp, true).MustSumDimIntlist([]int64{-1}, false, gotch.Invalid, true).MustNeg(true))
							V := m.Config.VocabSize
							for j := 0; j < 8; j++ {
								k := i*8 + j
								if j >= len(s.ResponseIDs) {
									if mask[k] != 0 || lp[k] != 0 || ent[k] != 0 {
										return fmt.Errorf("micro %d seq %d pos %d (padding): mask %g lp %g ent %g", micro, i, j, mask[k], lp[k], ent[k])
									}
									continue
								}
								at := len(s.PromptIDs) - 1 + j
								want := ref[at*V+s.ResponseIDs[j]]
								if mask[k] != 1 || math.Abs(lp[k]-want) > 1e-5 || math.Abs(ent[k]-refEnt[at]) > 1e-5 {
									return fmt.Errorf("micro %d seq %d token %d: mask %g, log-prob %.7f want %.7f, entropy %.7f want %.7f",
										micro, i, j, mask[k], lp[k], want, ent[k], refEnt[at])
								}
							}
						}
					}
					return nil
				})
			})
		})
	}
}

// With grad mode on, Score's log-probs backpropagate to the parameters (the train step).
func TestScoreBackward(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 97, gotch.Float, 0.02, 4)
	seqs := randomSequences(3, 97, 9)
	onTorch(t, func() error {
		sc, err := m.Score(seqs, false, 2)
		if err != nil {
			return err
		}
		if sc.Entropy != nil {
			return fmt.Errorf("entropy computed without being asked")
		}
		loss := sc.LogProbs.MustSum(gotch.Invalid, false).MustDiv(sc.Mask.MustSum(gotch.Invalid, false), true).MustNeg(true)
		loss.MustBackward()
		for _, p := range m.Parameters() {
			g := p.T.MustGrad(false)
			if !g.MustDefined() {
				return fmt.Errorf("%s has no gradient", p.Name)
			}
			n := g.MustNorm(false).Float64Values()[0]
			if n == 0 || math.IsNaN(n) {
				return fmt.Errorf("%s: gradient norm %g", p.Name, n)
			}
			p.T.ZeroGrad()
		}
		return nil
	})
}

func TestScoreRejectsBadInput(t *testing.T) {
	m := randomModel(t, arch.Llama, 50, gotch.Float, 0.02, 1)
	onTorch(t, func() error {
		for _, tc := range []struct {
			seqs []Sequence
			want string
		}{
			{[]Sequence{{PromptIDs: nil, ResponseIDs: []int{1}}}, "empty prompt"},
			{[]Sequence{{PromptIDs: []int{1}, ResponseIDs: []int{50}}}, "token id 50"},
			{nil, "no sequences"},
		} {
			if _, err := m.Score(tc.seqs, false, 0); err == nil || !contains(err.Error(), tc.want) {
				return fmt.Errorf("Score(%v) = %v, want an error with %q", tc.seqs, err, tc.want)
			}
		}
		return nil
	})
}

var _ = ts.None
