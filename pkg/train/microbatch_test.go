package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/torch"
)

// longTailItems are synthetic calls of two agents with prompts of 3–8 and responses of 1–14 tokens,
// with recorded old and reference log-probs near a tiny random model's (so the ratios clip now and
// then and the KL penalty has a gradient).
func longTailItems() []*item {
	resp := []int{14, 1, 3, 9, 2, 2, 6, 1, 11, 4}
	var out []*item
	for i, a := range []string{"solver", "verifier"} {
		for j := 0; j < 7; j++ {
			k := i*7 + j
			x := &item{agent: a, adv: math.Sin(float64(3*k+1)) + 0.1*float64(i)}
			for p := 0; p < 3+(k*5)%6; p++ {
				x.prompt = append(x.prompt, 40+(k*31+p*7)%150)
			}
			for r := 0; r < resp[k%len(resp)]; r++ {
				x.response = append(x.response, 40+(k*17+r*11)%150)
				x.old = append(x.old, float32(-5.5+0.4*math.Sin(float64(k+3*r))))
				x.ref = append(x.ref, float32(-5.5+0.6*math.Cos(float64(2*k+r))))
			}
			out = append(out, x)
		}
	}
	return out
}

// cut is a way of cutting an agent's calls into micro-batches: count calls each, or by a token budget.
type cut struct{ count, maxTokens int }

func (c cut) String() string {
	if c.maxTokens > 0 {
		return fmt.Sprintf("budget %d tokens", c.maxTokens)
	}
	return fmt.Sprintf("%d calls", c.count)
}

// cutResult is what one backward over a mini-batch leaves: every parameter's gradient and the
// step's figures (per-agent norms and loss terms, the step's loss terms and token counts).
type cutResult struct {
	grads [][]float64
	st    stepStats
}

// backwardCut runs ms.backward on mb cut as c.
func backwardCut(t *testing.T, ms *modelState, mb miniBatch, c cut) cutResult {
	t.Helper()
	ms.loss.maxTokens = c.maxTokens
	for a, co := range ms.loss.agents {
		co.microBatch = c.count
		ms.loss.agents[a] = co
	}
	var r cutResult
	err := torch.Do(func() error {
		ZeroGrad(ms.params)
		st, err := ms.backward(mb, ms.params)
		if err != nil {
			return err
		}
		r = cutResult{grads: gradSnapshot(ms.params), st: st}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// gradSnapshot copies the parameters' gradients (nil for a parameter without one).
func gradSnapshot(params []*ts.Tensor) [][]float64 {
	out := make([][]float64, len(params))
	for i, p := range params {
		if g := p.MustGrad(false); g.MustDefined() {
			out[i] = g.MustTotype(gotch.Double, true).Float64Values(true)
		}
	}
	return out
}

// relClose says whether got equals want to within tol relative (absolute below scale·tol).
func relClose(got, want, scale, tol float64) bool {
	return math.Abs(got-want) <= tol*math.Max(math.Abs(want), scale)
}

// sameCut compares a cut's result with the one-piece result: every parameter's gradient (the
// difference's norm relative to the gradient's), each agent's gradient norm and loss terms, and the
// step's loss terms and token counts, all to 1e-9 relative.
func sameCut(t *testing.T, name string, got, want cutResult) {
	t.Helper()
	const tol = 1e-9
	var total float64
	for i, w := range want.grads {
		var diff, norm float64
		for j := range w {
			d := got.grads[i][j] - w[j]
			diff, norm = diff+d*d, norm+w[j]*w[j]
		}
		total += norm
		if math.Sqrt(diff) > tol*math.Sqrt(norm) {
			t.Errorf("%s: parameter %d's gradient differs by %g (norm %g)", name, i, math.Sqrt(diff), math.Sqrt(norm))
		}
	}
	if total == 0 {
		t.Fatalf("%s: zero gradient: the comparison proves nothing", name)
	}
	if len(got.st.agents) != len(want.st.agents) {
		t.Fatalf("%s: %d agent shares, want %d", name, len(got.st.agents), len(want.st.agents))
	}
	num := func(what string, g, w float64) {
		if !relClose(g, w, 1e-12, tol) {
			t.Errorf("%s: %s %.17g, one piece %.17g", name, what, g, w)
		}
	}
	for i, w := range want.st.agents {
		g := got.st.agents[i]
		num(w.agent+" gradient norm", g.gradNorm, w.gradNorm)
		num(w.agent+" pg", g.loss.PG, w.loss.PG)
		num(w.agent+" entropy", g.loss.Entropy, w.loss.Entropy)
		num(w.agent+" kl", g.loss.KL, w.loss.KL)
	}
	num("pg", got.st.loss.PG, want.st.loss.PG)
	num("entropy", got.st.loss.Entropy, want.st.loss.Entropy)
	num("kl", got.st.loss.KL, want.st.loss.KL)
	num("tokens", got.st.tokens.Tokens, want.st.tokens.Tokens)
	num("clipped tokens", got.st.tokens.Clipped, want.st.tokens.Clipped)
	num("clipped-lower tokens", got.st.tokens.ClippedLow, want.st.tokens.ClippedLow)
	num("negative log-ratio", got.st.tokens.NegLogRatio, want.st.tokens.NegLogRatio)
}

// cutsAgree checks, on ms, that every cut of the long-tailed mini-batch gives the one-piece gradient
// and figures for every loss_agg_mode, each with a KL estimator and the entropy bonus, on- and
// off-policy, with and without gradient checkpointing.
func cutsAgree(t *testing.T, ms *modelState) {
	t.Helper()
	var items []*item // the calls of the model's agents
	for _, x := range longTailItems() {
		if _, ok := ms.loss.agents[x.agent]; ok {
			items = append(items, x)
		}
	}
	// Token budgets that cut differently: sequence lengths are 4–22; 22 puts the longest alone, 40
	// and 64 pack two and more, 10 leaves most calls alone (over the budget).
	cuts := []cut{{count: 1}, {count: 3}, {maxTokens: 10}, {maxTokens: 22}, {maxTokens: 40}, {maxTokens: 64}}
	kls := []string{algo.K1, algo.K3, algo.LowVarKL, algo.K2}
	clipped := 0.0
	for mi, mode := range algo.LossAggModes.Names() {
		for _, ckpt := range []bool{false, true} {
			for _, onPolicy := range []bool{true, false} {
				ms.loss.aggMode, ms.loss.klType, ms.upd.checkpointing = mode, kls[mi%len(kls)], ckpt
				mb := newMiniBatch(items, 6, onPolicy)
				whole := backwardCut(t, ms, mb, cut{count: len(items)})
				clipped += whole.st.tokens.Clipped
				for _, c := range cuts {
					sameCut(t, fmt.Sprintf("%s, kl %s, checkpointing %v, on-policy %v, %v", mode, ms.loss.klType, ckpt, onPolicy, c),
						backwardCut(t, ms, mb, c), whole)
				}
			}
		}
	}
	if clipped == 0 {
		t.Error("no token was clipped: the off-policy cases do not exercise the clip")
	}
}

// The cut of a mini-batch into micro-batches, by count or by a token budget, changes nothing of the
// step: the gradient of every parameter, the per-agent gradient norms and loss terms, and the
// logged loss terms and token counts equal the one-piece mini-batch's to 1e-9 (float64 models), for
// every loss_agg_mode with the KL penalty and the entropy bonus on, with and without gradient
// checkpointing, for every model family and for LoRA adapters.
func TestMicroBatchCutsAgree(t *testing.T) {
	sets := []string{"warmup.steps=0", "models.0.dtype=float64", "algorithm.entropy_coef=0.05",
		"algorithm.kl.coef=0.2", "agents.0.train.kl_coef=0.3"}
	for _, family := range arch.Names.Names() {
		t.Run(family, func(t *testing.T) {
			cfg := tinyConfig(t, t.TempDir(), append(sets,
				"models.0.init={model_type: "+family+", hidden_size: 16, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1}")...)
			cutsAgreeOn(t, cfg, "small")
		})
	}
	t.Run("lora", func(t *testing.T) {
		cutsAgreeOn(t, tinyLoRAConfig(t, t.TempDir(), sets...), "solver")
	})
}

func cutsAgreeOn(t *testing.T, cfg *config.Config, model string) {
	t.Helper()
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ms := modelOf(tr, model)
	if !ms.usesKL() {
		t.Fatal("no KL penalty: the KL term is not exercised")
	}
	if ms.ref == nil { // made when the run starts; the items carry their reference log-probs
		if err := torch.Do(ms.makeReference); err != nil {
			t.Fatal(err)
		}
	}
	cutsAgree(t, ms)
}

// Token shares: on a long-tailed rollout (both long trajectories in the first task) the ranks' token
// counts are close (400 and 390; the tasks' shares give 675 and 115), and they are a function of the
// rollout alone.
func TestTokenSharesBalance(t *testing.T) {
	lengths := []int{300, 280, 25, 30, 18, 22, 20, 15} // response tokens per trajectory, two per task
	roll := &env.Rollout{Tasks: make([]env.Task, 4)}
	for i, n := range lengths {
		roll.Trajectories = append(roll.Trajectories, env.Trajectory{TaskIndex: i / 2,
			Calls: []env.Call{{PromptIDs: make([]int, 10), ResponseIDs: make([]int, n)}, {PromptIDs: make([]int, 5)}}})
	}
	load := func(owner []int) []int {
		out := make([]int, 2)
		for i, r := range owner {
			out[r] += 10 + lengths[i]
		}
		return out
	}
	byTasks, byTokens := ownerOfTrajectory(roll, 2), tokenShares(roll, 2)
	if want := []int{0, 0, 0, 0, 1, 1, 1, 1}; !slices.Equal(byTasks, want) {
		t.Fatalf("task shares %v, want %v", byTasks, want)
	}
	lt := load(byTokens)
	if d := lt[0] - lt[1]; d < -40 || d > 40 || slices.Equal(byTokens, byTasks) {
		t.Errorf("token shares %v: tokens %v (tasks' shares: %v)", byTokens, lt, load(byTasks))
	}
	if want := []int{0, 1, 0, 1, 1, 1, 0, 0}; !slices.Equal(byTokens, want) {
		t.Errorf("token shares %v, want %v (longest first, each to the lighter rank)", byTokens, want)
	}
	if again := tokenShares(roll, 2); !slices.Equal(again, byTokens) {
		t.Errorf("token shares %v, then %v", byTokens, again)
	}
}

// A model's max_tokens_per_micro_batch overrides the algorithm's; 0 takes the algorithm's.
func TestTokenBudgetOverride(t *testing.T) {
	for _, c := range []struct {
		sets []string
		want int
	}{
		{nil, 0},
		{[]string{"algorithm.max_tokens_per_micro_batch=100"}, 100},
		{[]string{"algorithm.max_tokens_per_micro_batch=100", "models.0.max_tokens_per_micro_batch=40"}, 40},
		{[]string{"models.0.max_tokens_per_micro_batch=40"}, 40},
	} {
		tr, err := New(context.Background(), tinyConfig(t, t.TempDir(), append(c.sets, "warmup.steps=0")...), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := modelOf(tr, "small").loss.maxTokens; got != c.want {
			t.Errorf("%v: budget %d, want %d", c.sets, got, c.want)
		}
		tr.Close()
	}
}
