package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --dry-run --json carries the resolved config and the memory plan: a `memory` object whose
// `devices` entries hold the device, its peak, its capacity and the parts.
func TestTrainDryRunPlanJSON(t *testing.T) {
	out, _, err := execDrmas(t, "train", "--config", "../../configs/toy-math.yaml", "--dry-run", "--json", "--device-memory", "64GB",
		"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json", "--set", "run.steps=7")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Config struct {
			Run struct {
				Steps int `json:"steps"`
			} `json:"run"`
		} `json:"config"`
		Memory struct {
			Devices []map[string]any `json:"devices"`
			Models  []map[string]any `json:"models"`
		} `json:"memory"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Config.Run.Steps != 7 || len(doc.Memory.Devices) != 1 || len(doc.Memory.Models) != 1 {
		t.Fatalf("config steps %d, %d devices, %d models; want 7, 1, 1", doc.Config.Run.Steps, len(doc.Memory.Devices), len(doc.Memory.Models))
	}
	d := doc.Memory.Devices[0]
	if d["device"] != "cpu" || d["capacity_bytes"] != 64e9 || d["fits"] != true {
		t.Errorf("device %v", d)
	}
	peak, _ := d["peak_bytes"].(float64)
	v := map[string]float64{}
	for _, k := range []string{"static_bytes", "update_bytes", "rollout_bytes", "held_phase_bytes", "heap_held_bytes", "runtime_overhead_bytes"} {
		x, ok := d[k].(float64)
		if !ok {
			t.Errorf("device entry lacks %s: %v", k, d)
		}
		v[k] = x
	}
	// A toy's tensors all come from the C heap, which holds the rollout's blocks beside the
	// update's: the peak is the phase over the held heap.
	if parts := v["static_bytes"] + v["held_phase_bytes"] + v["runtime_overhead_bytes"]; peak <= 0 || peak != parts ||
		v["held_phase_bytes"] < v["update_bytes"] || v["held_phase_bytes"] < v["rollout_bytes"] || v["heap_held_bytes"] <= v["update_bytes"] {
		t.Errorf("peak_bytes %v, want static + held phase + runtime = %v (%v)", peak, parts, v)
	}
	for _, k := range []string{"weights_bytes", "master_weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
		"logits_chunk_bytes", "rollout_kv_bytes", "capacity_source"} {
		if _, ok := d[k]; !ok {
			t.Errorf("device entry lacks %s", k)
		}
	}
}

// drmas train refuses a run whose plan exceeds its device before anything is loaded or written
// (exit 2), naming the keys that would make it fit; --memory-check=false lets it start.
func TestTrainRefusesOverPlan(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	args := []string{"train", "--config", "../../configs/toy-math.yaml", "--device-memory", "cpu=100MB", "--log-level", "error",
		"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json", "--set", "run.dir=" + dir}
	_, _, err := execDrmas(t, args...)
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("err = %v, want a usage error (exit 2)", err)
	}
	for _, key := range []string{"100.0 MB", "algorithm.micro_batch_size", "models[0].gradient_checkpointing", "agents[0].sampling.max_new_tokens",
		"data.max_prompt_length", "models[0].device"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not name %q", err, key)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run.dir exists after a refused run (%v): the plan must come before anything is done", err)
	}
	// The dry run prints the plan, then fails the same way.
	out, _, err := execDrmas(t, append(args, "--dry-run")...)
	if !errors.As(err, &ue) || !strings.Contains(out, "DOES NOT FIT") {
		t.Errorf("dry run: err %v, output lacks DOES NOT FIT:\n%s", err, out)
	}
	// Not checked: the run starts (one small iteration).
	_, _, err = execDrmas(t, append(args, "--memory-check=false", "--set", "run.steps=1", "--set", "warmup.steps=0", "--set", "run.test_freq=0",
		"--set", "algorithm.batch_size=2", "--set", "algorithm.group_size=2")...)
	if err != nil {
		t.Errorf("--memory-check=false: %v", err)
	}
}

// The paper's configs are planned from configs/models alone: Qwen3-4B's math team fits an 80 GB
// GPU as configured, Qwen2.5-7B's search team a 141 GB one and not an 80 GB one.
func TestTrainDryRunPaperPlans(t *testing.T) {
	for _, tc := range []struct {
		config, model, memory string
		models                int
		fits                  bool
		want                  string
	}{
		{"math-qwen.yaml", "qwen3-4b", "80GB", 2, true, "solver: 4.02B params bfloat16, micro-batch 1 × (8192 prompt + 4096 response) tokens, checkpointing on"},
		{"math-qwen.yaml", "qwen3-4b", "70GB", 2, false, "DOES NOT FIT"},
		{"search-qwen.yaml", "qwen2.5-7b", "141GB", 3, true, "searcher: 7.62B params bfloat16, micro-batch 4 × (4096 prompt + 512 response) tokens, checkpointing on"},
		{"search-qwen.yaml", "qwen2.5-7b", "80GB", 3, false, "DOES NOT FIT"},
	} {
		args := []string{"train", "--config", "../../configs/" + tc.config, "--dry-run", "--check-files=false", "--device-memory", tc.memory}
		for i := range tc.models {
			args = append(args, "--set", "models."+string(rune('0'+i))+".path=../../configs/models/"+tc.model)
		}
		out, _, err := execDrmas(t, args...)
		if (err == nil) != tc.fits {
			t.Errorf("%s on %s: err %v, want fits=%v", tc.config, tc.memory, err, tc.fits)
		}
		if !strings.Contains(out, tc.want) || !strings.Contains(out, "# device cuda:0") {
			t.Errorf("%s on %s: the plan lacks %q:\n%s", tc.config, tc.memory, tc.want, out)
		}
	}
}

// With data.max_prompt_length unset, --dry-run measures the data's prompts and the plan takes their
// bound instead of the model's context: the text output names each agent's longest first-turn
// prompt with its response budget, the JSON carries them, and the model's prompt tokens are the
// largest bound (2,044 context tokens before).
func TestTrainDryRunMeasuresPrompts(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "train.jsonl")
	if err := os.WriteFile(data, []byte(`{"question": "1 + 1", "answer": "2"}`+"\n"+`{"question": "12 + 345 * 6 - 7", "answer": "2078"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"train", "--config", "../../configs/toy-math.yaml", "--dry-run", "--device-memory", "64GB",
		"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json", "--set", "toy.task=''", "--set", "warmup.steps=0", "--set", "data.train=" + data}
	out, _, err := execDrmas(t, append(args, "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Memory struct {
			Models  []map[string]any `json:"models"`
			Prompts []struct {
				Agent     string `json:"agent"`
				FirstTurn int    `json:"first_turn_tokens"`
				Bound     int    `json:"prompt_bound_tokens"`
				MaxNew    int    `json:"max_new_tokens"`
			} `json:"measured_prompts"`
		} `json:"memory"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	ps := doc.Memory.Prompts
	if len(ps) != 2 || ps[0].Agent != "solver" || ps[1].Agent != "verifier" {
		t.Fatalf("measured prompts %+v", ps)
	}
	largest := 0
	for _, p := range ps {
		if p.FirstTurn < 6 || p.Bound <= p.FirstTurn || p.MaxNew <= 0 {
			t.Errorf("measured %+v", p)
		}
		largest = max(largest, p.Bound)
	}
	m := doc.Memory.Models[0]
	if got, _ := m["prompt_tokens"].(float64); int(got) != largest || !strings.HasPrefix(m["prompt_bound"].(string), "data's prompts, measured") {
		t.Errorf("plan's prompt: %v tokens (%v), want the measured bound %d", m["prompt_tokens"], m["prompt_bound"], largest)
	}
	text, _, err := execDrmas(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# prompts measured on the data", "solver (small): longest first-turn prompt", "response budget"} {
		if !strings.Contains(text, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
	// data.max_prompt_length set: nothing measured, the key bounds the prompts.
	out, _, err = execDrmas(t, append(args, "--json", "--set", "data.max_prompt_length=100")...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "measured_prompts") || !strings.Contains(out, `"prompt_tokens": 100`) {
		t.Errorf("max_prompt_length 100: %s", out[strings.Index(out, `"memory"`):])
	}
}
