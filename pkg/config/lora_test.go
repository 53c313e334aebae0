package config

import (
	"slices"
	"strings"
	"testing"
)

const loraTeam = `
run: {dir: runs/x, steps: 5}
models:
  - {id: toy, tokenizer: tok.json, init: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}}
  - {id: solver, base: toy, lora: {rank: 4, alpha: 8, target_modules: all-linear}, optim: {lr: 1.0e-2}}
  - {id: verifier, base: toy, lora: {rank: 2, target_modules: [q_proj, v_proj]}}
agents:
  - {name: solver, model: solver}
  - {name: verifier, model: verifier}
orchestra: {type: math}
toy: {task: toy-math}
`

// Adapter entries load: lora settings (target_modules as PEFT's string or a list, defaults for the
// rest), the frozen base needs no agent of its own, and WeightsOf gives an adapter its base's
// weights settings.
func TestLoRAEntries(t *testing.T) {
	cfg, err := Load(write(t, loraTeam), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := cfg.ModelByID("solver")
	v, _ := cfg.ModelByID("verifier")
	if !s.IsAdapter() || s.LoRA.Rank != 4 || s.LoRA.Alpha != 8 || !slices.Equal(s.LoRA.TargetModules, []string{"all-linear"}) || s.Optim.LR != 1e-2 {
		t.Errorf("solver: %+v", s)
	}
	if v.LoRA.Rank != 2 || v.LoRA.Alpha != 16 || !slices.Equal(v.LoRA.TargetModules, []string{"q_proj", "v_proj"}) {
		t.Errorf("verifier: lora %+v (alpha default 16)", v.LoRA)
	}
	if !cfg.IsFrozenBase("toy") || cfg.IsFrozenBase("solver") || !slices.Equal(cfg.AdaptersOf("toy"), []string{"solver", "verifier"}) {
		t.Errorf("frozen base: %v %v", cfg.IsFrozenBase("toy"), cfg.AdaptersOf("toy"))
	}
	if w := cfg.WeightsOf(s); w.Tokenizer != "tok.json" || w.Init.HiddenSize != 32 || w.ID != "solver" || w.LoRA.Rank != 4 {
		t.Errorf("WeightsOf(solver): %+v", w)
	}
	// A checkpoint's config.yaml reads back (resume): adapters without base settings, the base
	// without lora settings.
	back := readBack(t, cfg)
	if bs, _ := back.ModelByID("solver"); bs.Base != "toy" || bs.LoRA.Rank != 4 || back.IsFrozenBase("solver") || !back.IsFrozenBase("toy") {
		t.Errorf("read back: %+v", bs)
	}
}

// Wrong adapter entries are refused with the key and the reason.
func TestLoRAEntriesRefused(t *testing.T) {
	for _, c := range []struct{ old, new, want string }{
		{"base: toy, lora: {rank: 4", "base: nope, lora: {rank: 4", `models[1].base: unknown model "nope"`},
		{"base: toy, lora: {rank: 2", "base: solver, lora: {rank: 2", `models[2].base: model "solver" is itself an adapter`},
		{"rank: 4, alpha: 8", "rank: 0, alpha: 8", "models[1].lora.rank"},
		{"rank: 4, alpha: 8", "rank: 4, alpha: -1", "models[1].lora.alpha"},
		{"alpha: 8, target", "alpha: 8, dropout: 0.1, target", "models[1].lora.dropout: 0.1: only 0 is supported"},
		{"[q_proj, v_proj]", "[q_proj, norm]", `models[2].lora.target_modules[1]: "norm" is not a module an adapter can target`},
		{"{id: solver, base: toy,", "{id: solver, base: toy, path: /x,", "models[1].path: an adapter (base: toy) has no path of its own"},
		{"{id: solver, base: toy,", "{id: solver, base: toy, init: {hidden_size: 8},", "models[1].init: an adapter"},
		{"{id: solver, base: toy,", "{id: solver, base: toy, dtype: bfloat16,", "models[1].dtype: an adapter"},
		{"init: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}}", "init: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}, lora: {rank: 2}}",
			"models[0].lora: only an adapter takes lora settings"},
		{"{name: verifier, model: verifier}", "{name: verifier, model: toy}", `agents[1].model: model "toy" is the frozen base of adapters solver, verifier`},
		{"optim: {lr: 1.0e-2}}", "optim: {lr: 1.0e-2}, rollout: {engine: vllm, urls: [http://127.0.0.1:8000]}}", "models[1].rollout.engine: vllm: an adapter's rollouts run where its base's do"},
	} {
		if !strings.Contains(loraTeam, c.old) {
			t.Fatalf("%q is not in the config", c.old)
		}
		_, err := Load(write(t, strings.Replace(loraTeam, c.old, c.new, 1)), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.new, err, c.want)
		}
	}
}

// An adapter of embed_tokens or lm_head on a base whose rollouts run on vLLM or SGLang loads, with a
// warning naming the key (engines' support varies); on local rollouts, or on the projections only,
// there is none.
func TestLoRAOuterTargetsOnEnginesWarn(t *testing.T) {
	outer := strings.Replace(loraTeam, "target_modules: [q_proj, v_proj]", "target_modules: [q_proj, v_proj, lm_head]", 1)
	served := strings.Replace(outer, "{id: toy, tokenizer: tok.json,", "{id: toy, tokenizer: tok.json, rollout: {engine: vllm, urls: [http://127.0.0.1:8000]},", 1)
	for _, c := range []struct {
		name, yaml string
		want       bool
	}{{"lm_head on vllm", served, true}, {"lm_head, local rollouts", outer, false},
		{"projections on vllm", strings.Replace(served, ", lm_head]", "]", 1), false}} {
		cfg, err := Load(write(t, c.yaml), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got string
		for _, w := range cfg.Warnings() {
			if strings.Contains(w, "embed_tokens and lm_head") {
				got = w
			}
		}
		if (got != "") != c.want || (c.want && !strings.Contains(got, "models[2].lora.target_modules names lm_head")) {
			t.Errorf("%s: warning %q, want one: %v", c.name, got, c.want)
		}
	}
}
