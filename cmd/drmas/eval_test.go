package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// eval on a trained toy checkpoint: avg@k and pass@k recomputed from the --out transcripts.
func TestEvalRecomputedFromTranscripts(t *testing.T) {
	run := t.TempDir()
	cfg := "../../configs/toy-math.yaml"
	small := []string{"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json",
		"--set", "models.0.init={hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2}",
		"--set", "toy.train=32", "--set", "toy.val=16"}
	args := append([]string{"train", "--config", cfg, "--set", "run.dir=" + run, "--set", "run.steps=1",
		"--set", "warmup.steps=60", "--set", "warmup.lr=2e-2", "--set", "run.test_freq=0", "--set", "algorithm.batch_size=2",
		"--set", "algorithm.group_size=2"}, small...)
	if _, stderr, err := execDrmas(t, args...); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	out := filepath.Join(t.TempDir(), "calls.jsonl")
	stdout, stderr, err := execDrmas(t, append([]string{"eval", "--config", cfg, "--checkpoint", filepath.Join(run, "step-1"),
		"--k", "4", "--limit", "16", "--out", out, "--json"}, small...)...)
	if err != nil {
		t.Fatalf("eval: %v\n%s", err, stderr)
	}
	var rep struct {
		K        int `json:"k"`
		Datasets []struct {
			Questions int     `json:"questions"`
			AvgAtK    float64 `json:"avg_at_k"`
			PassAtK   float64 `json:"pass_at_k"`
		} `json:"datasets"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("eval --json: %v\n%s", err, stdout)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type key struct {
		q string
		s int
	}
	success := map[key]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			QuestionID string `json:"question_id"`
			Sample     int    `json:"sample"`
			Success    bool   `json:"success"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		success[key{line.QuestionID, line.Sample}] = line.Success
	}
	wins := map[string]int{}
	for k, ok := range success {
		if ok {
			wins[k.q]++
		} else if _, seen := wins[k.q]; !seen {
			wins[k.q] = 0
		}
	}
	if len(wins) != 16 || len(success) != 16*4 {
		t.Fatalf("transcripts cover %d questions / %d samples, want 16 / 64", len(wins), len(success))
	}
	var avg, pass float64
	for _, w := range wins {
		avg += float64(w) / 4 / 16
		if w > 0 {
			pass += 1.0 / 16
		}
	}
	d := rep.Datasets[0]
	if pass == 0 {
		t.Fatal("no sample succeeded: the check below would hold for any report (warm-up too short?)")
	}
	if rep.K != 4 || d.Questions != 16 || math.Abs(d.AvgAtK-avg) > 1e-9 || math.Abs(d.PassAtK-pass) > 1e-9 {
		t.Errorf("report avg@4 %g pass@4 %g (k %d, %d questions); transcripts give %g and %g", d.AvgAtK, d.PassAtK, rep.K, d.Questions, avg, pass)
	}
}

func TestEvalBadInput(t *testing.T) {
	_, _, err := execDrmas(t, "eval", "--config", filepath.Join(t.TempDir(), "missing.yaml"))
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("missing config: err = %v, want a usage error (exit 2)", err)
	}
	_, _, err = execDrmas(t, "eval", "--config", "../../configs/toy-math.yaml", "--k", "0")
	if !errors.As(err, &ue) {
		t.Fatalf("--k 0: err = %v, want a usage error", err)
	}
}

// --limit 0 evaluates every question, whatever the config's run.val_limit (before: the 8 questions
// of toy.val were cut to run.val_limit's 2).
func TestEvalLimitZeroIsAll(t *testing.T) {
	stdout, stderr, err := execDrmas(t, "eval", "--config", "../../configs/toy-math.yaml", "--k", "1", "--limit", "0", "--json",
		"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json",
		"--set", "models.0.init={hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2}",
		"--set", "toy.train=8", "--set", "toy.val=8", "--set", "run.val_limit=2",
		"--set", "agents.0.sampling.max_new_tokens=4", "--set", "agents.1.sampling.max_new_tokens=4")
	if err != nil {
		t.Fatalf("eval: %v\n%s", err, stderr)
	}
	var rep struct {
		Datasets []struct {
			Questions int `json:"questions"`
		} `json:"datasets"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("eval --json: %v\n%s", err, stdout)
	}
	if len(rep.Datasets) != 1 || rep.Datasets[0].Questions != 8 {
		t.Fatalf("datasets %+v, want one of 8 questions (--limit 0: all)", rep.Datasets)
	}
}

// eval refuses a checkpoint whose bytes changed after it was written (its manifest's checksum), exit
// 2 naming the file (before: it evaluated whatever weights the bytes made).
func TestEvalRefusesChangedCheckpoint(t *testing.T) {
	run := t.TempDir()
	small := []string{"--config", "../../configs/toy-math.yaml", "--set", "models.0.tokenizer=../../configs/toy/tokenizer.json",
		"--set", "models.0.init={hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2}",
		"--set", "toy.train=8", "--set", "toy.val=4", "--set", "agents.0.sampling.max_new_tokens=4", "--set", "agents.1.sampling.max_new_tokens=4"}
	if _, stderr, err := execDrmas(t, append([]string{"train", "--set", "run.dir=" + run, "--set", "run.steps=1", "--set", "warmup.steps=0",
		"--set", "run.test_freq=0", "--set", "algorithm.batch_size=2", "--set", "algorithm.group_size=2"}, small...)...); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	ck := filepath.Join(run, "step-1")
	eval := append([]string{"eval", "--checkpoint", ck, "--k", "1"}, small...)
	if _, stderr, err := execDrmas(t, eval...); err != nil {
		t.Fatalf("eval of the intact checkpoint: %v\n%s", err, stderr)
	}
	weights := filepath.Join(ck, "small", "model.safetensors")
	b, err := os.ReadFile(weights)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0x10
	if err := os.WriteFile(weights, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = execDrmas(t, eval...)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), weights+": CRC-32C") {
		t.Fatalf("err = %v, want exit 2 naming %s's checksum", err, weights)
	}
}
