package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// readBack writes cfg's resolved YAML (what a checkpoint's config.yaml holds) and reads it back as
// a resume does.
func readBack(t *testing.T, cfg *Config) *Config {
	t.Helper()
	y, err := cfg.YAML()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadResolved(write(t, string(y)))
	if err != nil {
		t.Fatal(err)
	}
	return back
}

const minimal = `
run: {dir: runs/x, steps: 5}
models:
  - {id: m, tokenizer: tok.json, init: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}}
agents:
  - {name: solver, model: m}
  - {name: verifier, model: m}
orchestra: {type: math}
toy: {task: toy-math}
`

// Every config shipped under configs/ must load (make test dry-runs them through the CLI too).
func TestShippedConfigsLoad(t *testing.T) {
	files, _ := filepath.Glob("../../configs/*.yaml")
	if len(files) < 4 {
		t.Fatalf("found %d configs under configs/, want the toy, qwen and reference configs", len(files))
	}
	for _, f := range files {
		if _, err := Load(f, nil); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestDefaultsApplied(t *testing.T) {
	cfg, err := Load(write(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Models[0]
	if m.Optim.LR != 1e-6 || m.Optim.GradClip != 1 || m.DType != "float32" || m.Init.ModelType != "qwen2" {
		t.Errorf("model defaults not applied: %+v", m)
	}
	if cfg.Algorithm.GroupSize != 8 || cfg.Algorithm.Normalization.Preset != "drmas" || cfg.Run.Steps != 5 {
		t.Errorf("defaults/overrides wrong: %+v %+v", cfg.Algorithm, cfg.Run)
	}
}

func TestOverrides(t *testing.T) {
	p := write(t, minimal)
	t.Setenv("DRMAS_ALGORITHM_GROUP_SIZE", "4")
	t.Setenv("DRMAS_RUN_SEED", "7")
	cfg, err := Load(p, []string{"run.steps=9", "models.0.optim.lr=0.01", "algorithm.normalization=grpo",
		"algorithm.kl={coef: 0.1, type: k1}"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Algorithm.GroupSize != 4 || cfg.Run.Seed != 7 || cfg.Run.Steps != 9 {
		t.Errorf("overrides not applied: group %d seed %d steps %d", cfg.Algorithm.GroupSize, cfg.Run.Seed, cfg.Run.Steps)
	}
	if cfg.Models[0].Optim.LR != 0.01 || cfg.Algorithm.Normalization.Preset != "grpo" || cfg.Algorithm.KL.Coef != 0.1 || cfg.Algorithm.KL.Type != "k1" {
		t.Errorf("--set not applied: %+v %+v", cfg.Models[0].Optim, cfg.Algorithm)
	}
	// --set wins over the environment.
	cfg, err = Load(p, []string{"algorithm.group_size=2"})
	if err != nil || cfg.Algorithm.GroupSize != 2 {
		t.Errorf("--set should win over DRMAS_: %v %v", err, cfg)
	}
}

func TestNormalizationMap(t *testing.T) {
	cfg, err := Load(write(t, minimal), []string{"algorithm.normalization={mean: agent, std: none, weighting: trajectory}"})
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.Algorithm.Normalization
	if n.Mean != "agent" || n.Std != "none" || n.Weighting != "trajectory" {
		t.Errorf("normalization = %+v", n)
	}
}

func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name, body string
		sets       []string
		want       string
	}{
		{"unknown key", minimal + "algorithm: {group_sise: 4}\n", nil, "unknown key algorithm.group_sise"},
		{"unknown top key", minimal + "bogus: 1\n", nil, "unknown key bogus"},
		{"unknown list key", strings.Replace(minimal, "{name: solver, model: m}", "{name: solver, model: m, temp: 1}", 1), nil, "unknown key agents[0].temp"},
		{"wrong type", minimal + "algorithm: {group_size: many}\n", nil, "algorithm.group_size: want 'int', got 'string'"},
		{"out of range", minimal + "algorithm: {clip_ratio_low: 1.5}\n", nil, "algorithm.clip_ratio_low: must be in [0, 1)"},
		{"bad enum", minimal + "algorithm: {loss_agg_mode: sum}\n", nil, "algorithm.loss_agg_mode: must be one of"},
		{"unknown model", strings.Replace(minimal, "{name: verifier, model: m}", "{name: verifier, model: big}", 1), nil, `agents[1].model: unknown model "big"`},
		{"missing role", strings.Replace(minimal, "  - {name: verifier, model: m}\n", "", 1), nil, `needs an agent named "verifier"`},
		{"malformed yaml", "run: {dir: x\nmodels: [", nil, "malformed YAML"},
		{"models not a list", strings.Replace(minimal, "models:\n  - {id: m,", "models: {id: m,", 1), nil, "models: must be a list"},
		{"bad set", minimal, []string{"run.steps"}, "want key=value"},
		{"set wrong type", minimal, []string{"run.steps=lots"}, "run.steps: want 'int'"},
		{"set bad index", minimal, []string{"models.3.optim.lr=1"}, "out of range"},
		{"bad init range", minimal, []string{"models.0.init.initializer_range=0"}, "models[0].init.initializer_range: must be a finite number > 0"},
		{"bad shard stage", minimal, []string{"dist.shard=params"}, `dist.shard: must be one of none, optimizer, gradients, parameters (got "params")`},
		{"bad rollout gather", minimal, []string{"dist.rollout_gather=layer"}, `dist.rollout_gather: must be one of unit, model (got "layer")`},
		{"negative token budget", minimal, []string{"algorithm.max_tokens_per_micro_batch=-1"}, "algorithm.max_tokens_per_micro_batch: must be in [0, 1073741824] (got -1)"},
		{"negative model token budget", minimal, []string{"models.0.max_tokens_per_micro_batch=-8"}, "models[0].max_tokens_per_micro_batch: must be in [0, 1073741824] (got -8)"},
		{"bad balance", minimal, []string{"dist.balance=samples"}, `dist.balance: must be one of tokens, tasks (got "samples")`},
		{"bad offload", minimal, []string{"models.0.optim.offload=gpu"}, `models[0].optim.offload: must be one of none, cpu (got "gpu")`},
		{"shared lr override", strings.Replace(minimal, "{name: solver, model: m}", "{name: solver, model: m, train: {lr: 0.1}}", 1), nil, "agents[0].train.lr: model \"m\" is shared"},
		{"shared grad_clip override", strings.Replace(minimal, "{name: solver, model: m}", "{name: solver, model: m, train: {grad_clip: 0.2}}", 1), nil, "agents[0].train.grad_clip: model \"m\" is shared"},
		{"adaptive kl_in_reward without target", minimal, []string{"algorithm.kl_in_reward.coef=0.001", "algorithm.kl_in_reward.controller=adaptive", "algorithm.kl_in_reward.target=0"}, "algorithm.kl_in_reward.target"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := write(t, c.body)
			_, err := Load(p, c.sets)
			if err == nil {
				t.Fatalf("no error, want one containing %q", c.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) {
				t.Errorf("error %q does not contain %q", msg, c.want)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			if !strings.HasPrefix(c.name, "bad set") && !strings.HasPrefix(c.name, "set ") && !strings.Contains(msg, p) {
				t.Errorf("error %q does not name the file", msg)
			}
		})
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("err = %v, want a missing-file error naming the file", err)
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	cfg, err := Load("../../configs/toy-search.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cfg.YAML()
	if err != nil {
		t.Fatal(err)
	}
	p := write(t, string(b))
	again, err := Load(p, nil)
	if err != nil {
		t.Fatalf("resolved config does not load back: %v\n%s", err, b)
	}
	b2, _ := again.YAML()
	if string(b) != string(b2) {
		t.Errorf("resolved YAML changed on a round trip:\n%s\n---\n%s", b, b2)
	}
}

func TestMalformedYAMLOneLine(t *testing.T) {
	_, err := Load(write(t, "run: {dir: x}\nrun: {dir: y}\n"), nil)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "already defined") {
		t.Fatalf("err = %q, want one line about the duplicate key", err)
	}
}
