package train

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/rundir"
)

// tinyLoRAConfig is configs/toy-math-lora.yaml made small: a tiny frozen base (models[0]) and one
// rank-4 adapter per agent.
func tinyLoRAConfig(t *testing.T, dir string, sets ...string) *config.Config {
	t.Helper()
	base := []string{"run.dir=" + dir, "run.steps=4", "run.save_every=2", "run.test_freq=0", "run.keep_last=0",
		"run.threads=1", "run.max_minutes=0", "warmup.steps=2", "warmup.batch_size=8",
		"models.0.init={model_type: qwen2, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}",
		"models.1.lora.rank=4", "models.2.lora.rank=2", "models.2.lora.target_modules=[q_proj, v_proj, down_proj]",
		"algorithm.batch_size=4", "algorithm.group_size=4", "algorithm.micro_batch_size=8",
		"agents.0.sampling.max_new_tokens=4", "agents.1.sampling.max_new_tokens=4", "toy.train=64", "toy.val=8"}
	cfg, err := config.Load("../../configs/toy-math-lora.yaml", append(base, sets...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Models[0].Tokenizer = "../../" + cfg.Models[0].Tokenizer
	return cfg
}

// A run of adapters on a frozen base: the model groups are the adapters (their parameters only),
// checkpoints hold each adapter as a PEFT folder with its optimizer state and the base once
// (unchanged by RL), a resumed run (adapters, their AdamW state and KL references reloaded) is
// exact, and the checkpoint evaluates through LoadTeam.
func TestLoRARunResumesExactly(t *testing.T) {
	whole, parts := t.TempDir(), t.TempDir()
	tr := train(t, tinyLoRAConfig(t, whole), Options{})
	if len(tr.models) != 2 || modelOf(tr, "toy") != nil {
		t.Fatalf("model groups %d (toy a group: %v), want the two adapters", len(tr.models), modelOf(tr, "toy") != nil)
	}
	for _, ms := range tr.models {
		a := ms.pol.Model.Adapter()
		if a == nil || len(ms.params) != len(a.Parameters()) {
			t.Fatalf("%s: parameters %d, want its adapter's", ms.id, len(ms.params))
		}
	}
	for _, step := range []int{2, 4} {
		ck := rundir.CheckpointDir(whole, step)
		for _, f := range []string{"solver/adapter_config.json", "solver/adapter_model.safetensors", "solver/optim.safetensors",
			"verifier/adapter_model.safetensors", "toy/config.json", "toy/model.safetensors"} {
			if !rundir.RegularFile(filepath.Join(ck, f)) {
				t.Fatalf("%s: missing", filepath.Join(ck, f))
			}
		}
		for _, f := range []string{"toy/optim.json", "solver/config.json", "solver/model.safetensors"} {
			if rundir.RegularFile(filepath.Join(ck, f)) {
				t.Errorf("%s: should not be there", filepath.Join(ck, f))
			}
		}
		if _, err := rundir.Verify(ck, step); err != nil {
			t.Fatal(err)
		}
	}
	// The frozen base is written once and hard-linked by the later checkpoints; removing one
	// checkpoint leaves the others complete.
	for _, f := range []string{"model.safetensors", "config.json"} {
		first, err := os.Stat(filepath.Join(rundir.CheckpointDir(whole, 0), "toy", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range []int{2, 4} {
			if st, err := os.Stat(filepath.Join(rundir.CheckpointDir(whole, step), "toy", f)); err != nil || !os.SameFile(first, st) {
				t.Errorf("step-%d/toy/%s: not a link to step-0's (err %v)", step, f, err)
			}
		}
	}
	if err := os.RemoveAll(rundir.CheckpointDir(whole, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := rundir.Verify(rundir.CheckpointDir(whole, 4), 4); err != nil {
		t.Fatalf("step-4 after step-2 was removed: %v", err)
	}
	b0 := readBytes(t, filepath.Join(rundir.CheckpointDir(whole, 0), "toy", "model.safetensors"))
	b4 := readBytes(t, filepath.Join(rundir.CheckpointDir(whole, 4), "toy", "model.safetensors"))
	if !bytes.Equal(b0, b4) {
		t.Error("the frozen base changed during RL")
	}
	a0 := readBytes(t, filepath.Join(rundir.CheckpointDir(whole, 0), "solver", "adapter_model.safetensors"))
	a4 := readBytes(t, filepath.Join(rundir.CheckpointDir(whole, 4), "solver", "adapter_model.safetensors"))
	if bytes.Equal(a0, a4) {
		t.Error("the solver's adapter did not train")
	}
	if !rundir.RegularFile(filepath.Join(whole, "reference", "solver", policy.AdapterConfigFile)) {
		t.Error("the KL reference of an adapter is not a PEFT folder")
	}

	train(t, tinyLoRAConfig(t, parts, "run.steps=2"), Options{})
	tr = train(t, tinyLoRAConfig(t, parts), Options{Resume: true})
	if tr.step != 4 {
		t.Fatalf("resumed run ended at step %d, want 4", tr.step)
	}
	sameRows(t, readRows(t, whole), readRows(t, parts))
	if !bytes.Equal(a4, readBytes(t, filepath.Join(rundir.CheckpointDir(parts, 4), "solver", "adapter_model.safetensors"))) {
		t.Error("the resumed run's adapter differs from the uninterrupted run's")
	}

	// drmas eval's path: the team from the checkpoint.
	team, err := LoadTeam(tinyLoRAConfig(t, whole), "cpu", rundir.CheckpointDir(whole, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer team.Close()
	rep, err := team.Evaluate(context.Background(), team.Val, EvalOptions{EvalOptions: env.EvalOptions{K: 2}, Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Datasets) != 1 || rep.Datasets[0].Questions != 4 || len(rep.Agents) != 2 {
		t.Fatalf("eval report %+v", rep)
	}
	if _, err := os.Stat(filepath.Join(rundir.CheckpointDir(whole, 4), "solver", "config.json")); err == nil {
		t.Error("an adapter checkpoint folder has a config.json")
	}
}
