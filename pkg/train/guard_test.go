package train

import (
	"context"
	"math"
	"reflect"
	"testing"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/torch"
)

func TestGuardJudge(t *testing.T) {
	for _, tt := range []struct {
		action string
		scale  float64
	}{{"log", 1}, {"clip", 0.5}, {"skip", 0}} {
		g := newGuard(algo.Guard{Window: 3, Factor: 5, Action: tt.action})
		for _, n := range []float64{1, 3, 2} { // filling the window: no verdict yet
			if v := g.judge("a", n); v.spike || v.scale != 1 {
				t.Fatalf("%s: verdict %+v while the window fills", tt.action, v)
			}
		}
		if v := g.judge("a", 10); v.spike || v.scale != 1 || v.median != 2 { // 10 = 5 × median: not beyond
			t.Fatalf("%s: verdict %+v at the threshold", tt.action, v)
		}
		// The window is now {3, 2, 10}: median 3, threshold 15.
		v := g.judge("a", 30)
		if !v.spike || v.median != 3 || v.scale != tt.scale {
			t.Fatalf("%s: verdict %+v on a spike, want scale %g", tt.action, v, tt.scale)
		}
		if w := g.norms["a"]; !reflect.DeepEqual(w, []float64{2, 10, 30}) {
			t.Errorf("%s: window %v, want the last three norms, the spike included", tt.action, w)
		}
		if v := g.judge("a", math.NaN()); !v.nonfinite || v.scale != 0 || v.spike {
			t.Errorf("%s: verdict %+v on NaN", tt.action, v)
		}
		if v := g.judge("a", math.Inf(1)); !v.nonfinite || v.scale != 0 {
			t.Errorf("%s: verdict %+v on +Inf", tt.action, v)
		}
		g.judge("a", 0) // a zero share (every advantage 0) says nothing about the agent's scale
		if w := g.norms["a"]; !reflect.DeepEqual(w, []float64{2, 10, 30}) {
			t.Errorf("%s: window %v after NaN, Inf and 0", tt.action, w)
		}
		if v := g.judge("b", 1e9); v.spike { // agents have windows of their own
			t.Errorf("%s: agent b judged by a's window", tt.action)
		}
	}
	if newGuard(algo.Guard{Window: 0, Factor: 5, Action: "skip"}) != nil {
		t.Error("window 0 must turn the guard off")
	}
}

func TestGuardStateRoundTrip(t *testing.T) {
	g := newGuard(algo.Guard{Window: 3, Factor: 5, Action: "clip"})
	for _, n := range []float64{0.1, 0.2, 0.30000000000000004, 0.7} {
		g.judge("solver", n)
	}
	h := newGuard(algo.Guard{Window: 3, Factor: 5, Action: "clip"})
	h.restore(g.state())
	if !reflect.DeepEqual(g.norms, h.norms) {
		t.Fatalf("restored %v, saved %v", h.norms, g.norms)
	}
	h.restore(map[string][]float64{"solver": {1, 2, 3, 4, 5}}) // a longer window than configured
	if !reflect.DeepEqual(h.norms["solver"], []float64{3, 4, 5}) {
		t.Errorf("restore kept %v", h.norms["solver"])
	}
}

// guardTrainer is a trainer on the tiny shared toy-math model with the guard on and no KL or entropy
// term, so that an agent whose advantages are all 0 adds exactly nothing to the gradient.
func guardTrainer(t *testing.T, action string) (*Trainer, *modelState) {
	cfg := tinyConfig(t, t.TempDir(), "warmup.steps=0", "algorithm.kl.coef=0", "algorithm.entropy_coef=0",
		"algorithm.guard={window: 3, factor: 5, action: "+action+"}")
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr, modelOf(tr, "small")
}

// withoutAgent copies items with the agent's advantages set to 0: its share of the gradient is zero.
func withoutAgent(items []*item, agent string) []*item { return scaled(items, agent, 0) }

// scaled copies items with the agent's advantages multiplied by f. The calls are on-policy (ratio 1,
// inside the clip range) and the loss has no KL or entropy term, so the agent's share of the
// gradient is multiplied by f: a spike (f = 1000) or a non-finite share (f = ±Inf or NaN) made in
// the data, through the production step.
func scaled(items []*item, agent string, f float64) []*item {
	var out []*item
	for _, x := range items {
		y := *x
		if y.agent == agent || agent == "" {
			y.adv *= f
		}
		out = append(out, &y)
	}
	return out
}

// A spike in the verifier's share of a shared model is left out of the step (skip): the
// weights and AdamW moments after the step are bit-identical to those of a run whose verifier added
// nothing, so the solver's update is untouched; with clip, the verifier's share is scaled to the
// threshold and only it.
func TestGuardSpikeInOneAgent(t *testing.T) {
	items := synthItems("solver", "verifier")
	run := func(action string, last []*item) (*modelState, stepStats) {
		_, ms := guardTrainer(t, action)
		var st stepStats
		torch.Do(func() error {
			for it := 1; it <= 3; it++ { // fill the windows with the ordinary shares
				if _, err := ms.optimizerStep(newMiniBatch(items, 4, true), it); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			if st, err = ms.optimizerStep(newMiniBatch(last, 4, true), 4); err != nil {
				t.Fatal(err)
			}
			return nil
		})
		return ms, st
	}
	spiked, st := run("skip", scaled(items, "verifier", 1000))
	quiet, _ := run("skip", withoutAgent(items, "verifier"))
	if v := st.agents[1].verdict; st.agents[1].agent != "verifier" || !v.spike || v.scale != 0 || st.agents[0].verdict.spike {
		t.Fatalf("verdicts %+v", st.agents)
	}
	torch.Do(func() error {
		for name, pair := range map[string][2][][]float64{
			"weights":    {snapshot(spiked.params), snapshot(quiet.params)},
			"exp_avg":    {snapshot(spiked.opt.M), snapshot(quiet.opt.M)},
			"exp_avg_sq": {snapshot(spiked.opt.V), snapshot(quiet.opt.V)},
		} {
			for i := range pair[0] {
				for j := range pair[0][i] {
					if pair[0][i][j] != pair[1][i][j] {
						t.Fatalf("%s differ (tensor %d, element %d): the skipped share left a trace", name, i, j)
					}
				}
			}
		}
		return nil
	})

	// clip: after the guard the verifier's share has norm factor × median, measured in backward.
	_, ms := guardTrainer(t, "clip")
	torch.Do(func() error {
		mb := newMiniBatch(items, 4, true)
		for it := 1; it <= 3; it++ {
			if _, err := ms.optimizerStep(mb, it); err != nil {
				t.Fatal(err)
			}
		}
		window := append([]float64(nil), ms.guard.norms["verifier"]...)
		ZeroGrad(ms.params)
		st, err := ms.backward(newMiniBatch(scaled(items, "verifier", 1000), 4, true), ms.params)
		if err != nil {
			t.Fatal(err)
		}
		after := snapshotGrads(ms.params)
		defer dropAll(after)
		v := st.agents[1].verdict
		threshold := 5 * median(window)
		if !v.spike || math.Abs(v.scale*st.agents[1].gradNorm-threshold) > 1e-9*threshold {
			t.Fatalf("clip verdict %+v on norm %g, want the share scaled to %g", v, st.agents[1].gradNorm, threshold)
		}
		// The solver's share alone, then the verifier's clipped share: the difference has the threshold's norm.
		ms.guard = nil
		ZeroGrad(ms.params)
		if _, err := ms.backward(newMiniBatch(withoutAgent(items, "verifier"), 4, true), ms.params); err != nil {
			t.Fatal(err)
		}
		if got := gradDiffNorm(ms.params, after); math.Abs(got-threshold) > 1e-4*threshold {
			t.Errorf("clipped share norm %g, want %g", got, threshold)
		}
		return nil
	})
}

// A non-finite share is left out whatever the action; when every share is, the step is a non-finite
// one (skipped, counted in the streak).
func TestGuardNonfiniteShare(t *testing.T) {
	_, ms := guardTrainer(t, "log")
	items := synthItems("solver", "verifier")
	torch.Do(func() error {
		st, err := ms.optimizerStep(newMiniBatch(scaled(items, "verifier", math.Inf(1)), 4, true), 1)
		if err != nil {
			t.Fatal(err)
		}
		if v := st.agents[1].verdict; !v.nonfinite || st.skipped || !isFinite(st.gradNorm) || ms.opt.Step != 1 {
			t.Fatalf("one non-finite share: verdict %+v, step skipped %v, norm %g, AdamW steps %d", v, st.skipped, st.gradNorm, ms.opt.Step)
		}
		st, err = ms.optimizerStep(newMiniBatch(scaled(items, "", math.NaN()), 4, true), 2)
		if err != nil {
			t.Fatal(err)
		}
		if !st.skipped || ms.streak != 1 || ms.opt.Step != 1 {
			t.Fatalf("every share non-finite: skipped %v, streak %d, AdamW steps %d", st.skipped, ms.streak, ms.opt.Step)
		}
		return nil
	})
}

// The guard's windows are in the checkpoint: a run resumed halfway logs the same guard decisions and
// ends with the same weights as an uninterrupted one.
func TestGuardResume(t *testing.T) {
	sets := []string{"algorithm.guard={window: 3, factor: 1.05, action: clip}", "algorithm.ppo_mini_update_num=2"} // a low factor: the guard acts often
	whole, parts := t.TempDir(), t.TempDir()
	train(t, tinyConfig(t, whole, sets...), Options{})
	train(t, tinyConfig(t, parts, append(sets, "run.steps=2")...), Options{})
	train(t, tinyConfig(t, parts, sets...), Options{Resume: true})
	a, b := readRows(t, whole), readRows(t, parts)
	sameRows(t, a, b)
	spikes := 0.0
	for _, row := range a {
		for _, k := range []string{"guard/agent/solver", "guard/agent/verifier"} {
			v, ok := row[k].(float64)
			if !ok {
				t.Fatalf("row %v lacks %s", row["step"], k)
			}
			spikes += v
		}
	}
	t.Logf("guard decisions in 4 iterations: %g spikes", spikes)
}
