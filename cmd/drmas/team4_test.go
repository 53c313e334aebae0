package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The reference's 4-agent math team (configs/math-team-4.yaml, a flow) trains 2 iterations with its
// model swapped for a tiny random one and its data for the toy math task: every one of the four
// agents is called, and each gets its own advantages and a gradient.
func TestMathTeam4Trains(t *testing.T) {
	run := t.TempDir()
	args := []string{"train", "--config", "../../configs/math-team-4.yaml", "--set", "run.dir=" + run,
		"--set", "run.steps=2", "--set", "run.test_freq=0", "--set", "run.save_every=0", "--set", "run.tensorboard=false",
		"--set", "models.0={id: team, init: {model_type: qwen3, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 2048}, tokenizer: ../../configs/toy/tokenizer.json, optim: {lr: 1.0e-3}}",
		"--set", "toy.task=toy-math", "--set", "data={max_prompt_length: 1024}", "--set", "dist.shard=none",
		"--set", "algorithm.batch_size=2", "--set", "algorithm.group_size=2", "--set", "algorithm.micro_batch_size=8"}
	for i := 0; i < 4; i++ {
		args = append(args, "--set", "agents."+string(rune('0'+i))+".sampling.max_new_tokens=8")
	}
	if _, stderr, err := execDrmas(t, args...); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	f, err := os.Open(filepath.Join(run, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		rows++
		for _, a := range []string{"solver", "critic", "refiner", "verifier"} {
			if c, _ := m["calls/agent/"+a].(float64); c <= 0 {
				t.Errorf("row %d: agent %s not called (calls/agent/%s = %v)", rows, a, a, m["calls/agent/"+a])
			}
			if _, ok := m["grad_norm/agent/"+a]; !ok {
				t.Errorf("row %d: no gradient norm for agent %s", rows, a)
			}
		}
	}
	if rows != 2 {
		t.Fatalf("%d metrics rows, want 2", rows)
	}
}
