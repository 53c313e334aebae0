package main

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestTrainDryRun(t *testing.T) {
	out, _, err := execDrmas(t, "train", "--config", "../../configs/toy-search.yaml", "--dry-run", "--set", "run.steps=7",
		"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"steps: 7", "type: search", "normalization:", "preset: drmas"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
}

// Bad configs are one-line errors naming the problem, with exit code 2 (a usage error).
func TestTrainBadConfigExit2(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, err := os.ReadFile("../../configs/toy-math.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wrongType := regexp.MustCompile(`warmup: \{steps: \d+`).ReplaceAllString(string(good), "warmup: {steps: many")
	if wrongType == string(good) {
		t.Fatal("configs/toy-math.yaml has no `warmup: {steps: N` to break")
	}
	cases := map[string]struct{ path, want string }{
		"missing file":   {filepath.Join(dir, "none.yaml"), "none.yaml"},
		"unknown key":    {write("unknown.yaml", string(good)+"\nbogus_section: 1\n"), "unknown key bogus_section"},
		"wrong type":     {write("type.yaml", wrongType), "warmup.steps"},
		"duplicate key":  {write("dup.yaml", string(good)+"\nwarmup: {steps: 1}\n"), "already defined"},
		"malformed yaml": {write("bad.yaml", "run: [\n"), "malformed YAML"},
	}
	for name, c := range cases {
		_, _, err := execDrmas(t, "train", "--config", c.path, "--dry-run")
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%s: err = %v, want a usage error (exit 2)", name, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("%s: error %q should be one line containing %q", name, msg, c.want)
		}
	}
}

// --dry-run catches what training would hit at once, without loading weights (before: it only
// printed the config).
func TestTrainDryRunChecks(t *testing.T) {
	dir := t.TempDir()
	tok := "models.0.tokenizer=../../configs/toy/tokenizer.json"
	data := filepath.Join(dir, "train.jsonl")
	if err := os.WriteFile(data, []byte(`{"question": "q1", "answer": "1"}`+"\n"+`{"question": "q2",`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(dir, "long.jsonl")
	if err := os.WriteFile(long, []byte(`{"question": "`+strings.Repeat("9", 5000)+`", "answer": "1"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A Qwen3 folder (its config.json, the toy chat template) with the toy tokenizer: not its tokenizer.
	qwen := filepath.Join(dir, "qwen3")
	if err := os.MkdirAll(qwen, 0o755); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{"../../configs/models/qwen3-4b/config.json": "config.json", "../../configs/toy/tokenizer_config.json": "tokenizer_config.json"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(qwen, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := map[string]struct {
		sets []string
		want string
	}{
		"tokenizer of another model": {[]string{tok, "models.0.path=" + qwen}, "tokenizer ../../configs/toy/tokenizer.json does not belong to the model of " +
			filepath.Join(qwen, "config.json") + ": config.json's special token id 151645 is outside the tokenizer's"},
		"overlong prompt":   {[]string{tok, "toy.task=''", "data.train=" + long, "warmup.steps=0"}, "long.jsonl:1: agent solver's first prompt is"},
		"missing tokenizer": {[]string{"models.0.tokenizer=" + filepath.Join(dir, "none.json")}, "none.json"},
		"bad prompt":        {[]string{tok, "agents.0.prompt='{{.Nope}}'"}, "agents[0].prompt"},
		"bad data line":     {[]string{tok, "toy.task=''", "data.train=" + data, "warmup.steps=0"}, "train.jsonl:2"},
		"too long":          {[]string{tok, "models.0.init.max_position_embeddings=40", "agents.0.sampling.max_new_tokens=39"}, "exceeds max_position_embeddings 40"},
	}
	for name, c := range cases {
		args := []string{"train", "--config", "../../configs/toy-math.yaml", "--dry-run"}
		for _, s := range c.sets {
			args = append(args, "--set", s)
		}
		_, _, err := execDrmas(t, args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want a usage error (exit 2) containing %q", name, err, c.want)
		}
	}
	// An unreachable retriever server is only a warning: it may be started later.
	good := filepath.Join(dir, "good.jsonl")
	if err := os.WriteFile(good, []byte(`{"question": "q1", "golden_answers": ["1"]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := execDrmas(t, "train", "--config", "../../configs/toy-search.yaml", "--dry-run", "--set", tok,
		"--set", "retriever={type: http, url: 'http://127.0.0.1:1/retrieve'}", "--set", "toy.task=''", "--set", "data.train="+good,
		"--set", "warmup.steps=0", "--set", "orchestra.curriculum={inject: {p0: 0}, force_search: {p0: 0}}")
	if err != nil {
		t.Errorf("unreachable retriever: err = %v, want a warning only", err)
	}
}

// A command run without --config is bad input, exit 2 as the README says (before: cobra's required
// flag error, exit 1).
func TestMissingConfigIsBadInput(t *testing.T) {
	for _, cmd := range []string{"train", "eval"} {
		_, _, err := execDrmas(t, cmd)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), `"config"`) {
			t.Errorf("%s without --config: err = %v, want a usage error naming --config", cmd, err)
		}
	}
}

// The hint of a plan that could not be made names the configs/models folder of each model's family
// (before: the Qwen3-4B folder for a Qwen2.5-7B team).
func TestPlanHintNamesEachModelsFolder(t *testing.T) {
	t.Chdir("../..")
	for file, want := range map[string]string{"configs/search-qwen.yaml": "models.2.path=configs/models/qwen2.5-7b",
		"configs/math-qwen.yaml": "models.1.path=configs/models/qwen3-4b"} {
		cfg, err := loadConfig(file, nil)
		if err != nil {
			t.Fatal(err)
		}
		if h := planHint(cfg.Models); !strings.Contains(h, want) || strings.Contains(file, "search") && strings.Contains(h, "qwen3") {
			t.Errorf("%s: hint %q, want %s", file, h, want)
		}
	}
}

// With --check-files=false a plan that cannot be made for want of a model folder is a warning (the
// Qwen configs' folders live on GPU machines), but a plan refused for its size is refused (#52: a
// micro-batch of 1.6 EB of activations passed the dry run as a warning, exit 0).
func TestDryRunRefusesAnImpossiblePlanWithoutFiles(t *testing.T) {
	t.Chdir("../..")
	_, _, err := execDrmas(t, "train", "--config", "configs/math-qwen.yaml", "--dry-run", "--check-files=false")
	if err != nil {
		t.Fatalf("model folders missing: err = %v, want a warning only", err)
	}
	_, _, err = execDrmas(t, "train", "--config", "configs/math-qwen.yaml", "--dry-run", "--check-files=false",
		"--set", "models.0.path=configs/models/qwen3-4b", "--set", "models.1.path=configs/models/qwen3-4b",
		"--set", "algorithm.micro_batch_size=65536", "--set", "data.max_prompt_length=4000000")
	var bad usageError
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), "the activations of one micro-batch would take") {
		t.Errorf("a plan of exabytes: err = %v, want bad input naming the part", err)
	}
}

// A refused run prints the plan it refuses (#52: one line; the plan only with --memory-check=false),
// the KV cache saying where its rows come from, and exits 2 before loading anything.
func TestRefusedRunPrintsThePlan(t *testing.T) {
	t.Chdir("../..")
	_, stderr, err := execDrmas(t, "train", "--config", "configs/toy-math.yaml", "--device-memory", "cpu=100MB",
		"--set", "run.dir="+t.TempDir())
	var bad usageError
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), "more than its 100.0 MB") {
		t.Fatalf("err = %v, want the plan refused", err)
	}
	for _, want := range []string{"# memory plan", "peak", "DOES NOT FIT", "rollout 128 rows (algorithm.batch_size 16 × group_size 8)",
		"rollout KV cache", "128 rows × 13 tokens: algorithm.batch_size 16 × group_size 8, prompt + response"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the refusal's output lacks %q:\n%s", want, stderr)
		}
	}
}
