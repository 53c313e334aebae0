package train

import (
	"context"
	"fmt"
	"testing"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/torch"
)

// Calls without signal (advantage 0, no KL or entropy term) are left out of the backward, and the
// gradient, the per-agent norms and the pg loss equal those of the backward over every call, for
// every loss_agg_mode, on- and off-policy: the left-out calls are counted with their tokens. With a
// KL or an entropy term every call carries a gradient, and none is left out.
func TestIdleCallsLeftOut(t *testing.T) {
	for _, terms := range []struct {
		name string
		sets []string
		idle bool
	}{
		{"pg only", []string{"algorithm.kl.coef=0"}, true},
		{"kl", []string{"algorithm.kl.coef=0.2"}, false},
		{"entropy", []string{"algorithm.kl.coef=0", "algorithm.entropy_coef=0.05"}, false},
	} {
		t.Run(terms.name, func(t *testing.T) {
			cfg := tinyConfig(t, t.TempDir(), append([]string{"warmup.steps=0", "models.0.dtype=float64"}, terms.sets...)...)
			tr, err := New(context.Background(), cfg, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			ms := modelOf(tr, "small")
			if ms.usesKL() && ms.ref == nil {
				if err := torch.Do(ms.makeReference); err != nil {
					t.Fatal(err)
				}
			}
			var items []*item
			zeros, zeroTokens := 0, 0
			for i, x := range longTailItems() {
				if _, ok := ms.loss.agents[x.agent]; !ok {
					continue
				}
				if i%3 == 0 {
					x.adv = 0
					zeros++
					zeroTokens += len(x.response)
				}
				items = append(items, x)
			}
			if zeros == 0 || zeros == len(items) {
				t.Fatalf("%d of %d calls without signal: the test proves nothing", zeros, len(items))
			}
			for _, mode := range algo.LossAggModes.Names() {
				for _, onPolicy := range []bool{true, false} {
					ms.loss.aggMode = mode
					name := fmt.Sprintf("%s, on-policy %v", mode, onPolicy)
					mb := newMiniBatch(items, 6, onPolicy)
					got := backwardCut(t, ms, mb, cut{count: 3})
					want := everyCall(t, ms, mb)
					if !terms.idle {
						if got.st.tokens.IdleCalls != 0 {
							t.Errorf("%s: %g calls left out, though every call carries a KL or entropy gradient", name, got.st.tokens.IdleCalls)
						}
						continue
					}
					if got.st.tokens.IdleCalls != float64(zeros) || got.st.tokens.IdleTokens != float64(zeroTokens) {
						t.Errorf("%s: left out %g calls, %g tokens; want %d, %d", name, got.st.tokens.IdleCalls, got.st.tokens.IdleTokens, zeros, zeroTokens)
					}
					if got.st.tokens.Tokens+got.st.tokens.IdleTokens != want.st.tokens.Tokens {
						t.Errorf("%s: %g tokens trained + %g left out, want %g in all", name, got.st.tokens.Tokens, got.st.tokens.IdleTokens, want.st.tokens.Tokens)
					}
					got.st.tokens, want.st.tokens = tokenCounts{}, tokenCounts{} // the clip figures are over the tokens trained
					// so is the entropy, a diagnostic here (no entropy term): loss/entropy is not written
					// for such a step, entropy/agent/* is per token trained
					zeroEntropy(&got.st)
					zeroEntropy(&want.st)
					sameCut(t, name, got, want)
				}
			}
		})
	}
}

// everyCall runs the mini-batch's backward over every call, none left out: each agent's calls in
// one micro-batch straight through microBatchLoss, its share measured alone.
func everyCall(t *testing.T, ms *modelState, mb miniBatch) cutResult {
	t.Helper()
	var r cutResult
	err := torch.Do(func() error {
		agents, byAgent := groupByAgent(mb.items)
		total := make([][]float64, 0)
		for _, a := range agents {
			ZeroGrad(ms.params)
			loss, tok, err := ms.microBatchLoss(byAgent[a], ms.loss.agents[a], mb)
			if err != nil {
				return err
			}
			g := gradSnapshot(ms.params)
			for i, p := range g {
				if len(total) <= i {
					total = append(total, make([]float64, len(p)))
				}
				for j, v := range p {
					total[i][j] += v
				}
			}
			r.st.agents = append(r.st.agents, agentShare{agent: a, loss: loss, gradNorm: GradNorm(ms.params)})
			r.st.loss.add(loss)
			r.st.tokens.add(tok)
		}
		r.grads = total
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// zeroEntropy clears the step's and its agents' entropy figures.
func zeroEntropy(st *stepStats) {
	st.loss.Entropy = 0
	for i := range st.agents {
		st.agents[i].loss.Entropy = 0
	}
}
