package train

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/torch"
)

// One expert is a dense MLP: a Qwen3-MoE whose sparse layers hold a single expert (top-1,
// renormalized, so its weight is 1 whatever the router says) trains exactly as the dense model whose
// MLPs are that expert — every metric of every iteration and every weight of the final checkpoint
// equal, bit for bit, in float64 — although its run goes the whole mixture-of-experts way: the
// router, the tokens grouped by expert, the routes recorded by the rollout, carried to training and
// replayed in the old, reference and update passes. A fault on that way (a token sent to the wrong
// row or dropped, a pass that routes otherwise than the rollout, a gradient lost in the grouping)
// would part the two runs; the router's own random weights must not matter, and do not. The gate
// weights' arithmetic (1 here) is TestMoEGroupedMatchesDense's; docs/real-models.md uses this arm as
// the control when a mixture of 4 experts learns the toy team against dense.
func TestOneExpertTrainsAsDense(t *testing.T) {
	root := t.TempDir()
	sets := append(slices.Clone(moeInit), "models.0.init.num_experts=0", "run.steps=3", "run.save_every=3",
		"warmup.steps=30", "warmup.lr=0.01", "algorithm.kl.coef=0.05") // a warm-up and a KL term: every step has gradients
	cfg := tinyConfig(t, filepath.Join(root, "unused"), sets...)
	tok, err := tokenizer.Load(cfg.Models[0].Tokenizer)
	if err != nil {
		t.Fatal(err)
	}
	in := cfg.Models[0].Init
	denseArch, err := in.ArchConfig(tok.VocabSize())
	if err != nil {
		t.Fatal(err)
	}
	one := 1
	in.MoE.NumExperts, in.MoE.NumExpertsPerTok, in.MoE.MoEIntermediateSize = &one, 1, denseArch.IntermediateSize
	moeArch, err := in.ArchConfig(tok.VocabSize())
	if err != nil {
		t.Fatal(err)
	}
	denseDir, moeDir := filepath.Join(root, "dense-model"), filepath.Join(root, "moe-model")
	if err := torch.Do(func() error {
		d, err := policy.NewRandom(denseArch, gotch.CPU, gotch.Double, 7)
		if err != nil {
			return err
		}
		defer d.Free()
		m, err := policy.NewRandom(moeArch, gotch.CPU, gotch.Double, 8)
		if err != nil {
			return err
		}
		defer m.Free()
		dense := map[string]policy.Param{}
		for _, p := range d.Parameters() {
			dense[p.Name] = p
		}
		routers := 0
		if err := torch.NoGrad(func() error {
			for _, p := range m.Parameters() {
				if strings.Contains(p.Name, ".mlp.gate.") {
					routers++ // stays random
					continue
				}
				p.T.Copy_(dense[denseName(p.Name)].T)
			}
			return nil
		}); err != nil {
			return err
		}
		if routers != 2 {
			t.Errorf("%d routers, want one in each of the 2 layers", routers)
		}
		if err := d.Save(denseDir); err != nil {
			return err
		}
		return m.Save(moeDir)
	}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{denseDir, moeDir} { // a model folder carries its tokenizer
		for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(cfg.Models[0].Tokenizer), f))
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, f), b, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	run := func(name, model string) string {
		dir := filepath.Join(root, name)
		train(t, tinyConfig(t, dir, append(slices.Clone(sets), "models.0.path="+model)...), Options{})
		return dir
	}
	denseRun, moeRun := run("dense", denseDir), run("moe", moeDir)
	rowsDense, rowsMoE := readRows(t, denseRun), readRows(t, moeRun)
	if len(rowsMoE) != 3 {
		t.Fatalf("%d metrics rows, want 3", len(rowsMoE))
	}
	for _, row := range rowsMoE {
		if _, ok := row["routing/mismatch/small"]; !ok {
			t.Fatalf("the one-expert run has no routing metrics: it did not go the mixture-of-experts way")
		}
		for k := range row {
			if strings.HasPrefix(k, "routing/") || strings.HasPrefix(k, "loss/router_aux/") {
				delete(row, k)
			}
		}
	}
	signal := false
	for _, row := range rowsDense {
		signal = signal || row["reward/mean"] != 0.0
	}
	if !signal {
		t.Fatal("no reward in 3 iterations: the test would compare runs without a policy gradient")
	}
	sameRows(t, rowsDense, rowsMoE)

	if err := torch.Do(func() error {
		d, err := policy.Load(filepath.Join(denseRun, "step-3", "small"), gotch.CPU, gotch.Double)
		if err != nil {
			return err
		}
		defer d.Free()
		m, err := policy.Load(filepath.Join(moeRun, "step-3", "small"), gotch.CPU, gotch.Double)
		if err != nil {
			return err
		}
		defer m.Free()
		trained := map[string][]float64{}
		for _, p := range m.Parameters() {
			trained[denseName(p.Name)] = p.T.Float64Values()
		}
		for _, p := range d.Parameters() {
			if !slices.Equal(p.T.Float64Values(), trained[p.Name]) {
				t.Errorf("%s: the one-expert model's differs from the dense model's after 3 iterations", p.Name)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// denseName is the dense model's name of a one-expert model's weight (mlp.experts.0.up_proj → mlp.up_proj).
func denseName(name string) string { return strings.Replace(name, ".mlp.experts.0.", ".mlp.", 1) }
