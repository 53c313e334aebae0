package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tool toy team trains end to end: its Answerer's tool calls run (the built-in lookup), each
// response is a call of the trajectory with the tool results in the next call's prompt, and the
// rollout dump shows every call's tool use.
func TestToolTeamTrains(t *testing.T) {
	run := t.TempDir()
	if _, stderr, err := execDrmas(t, "train", "--config", "../../configs/toy-tool-team.yaml", "--set", "run.dir="+run,
		"--set", "run.steps=2", "--set", "run.test_freq=0", "--set", "run.dump_every=1", "--set", "run.tensorboard=false",
		"--set", "algorithm.batch_size=4", "--set", "toy.train=64", "--set", "toy.val=8", "--set", "warmup.steps=100", "--set", "models.0.tokenizer=../../configs/toy/tokenizer.json"); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	f, err := os.Open(filepath.Join(run, "rollouts", "step-2.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var withTools, answered, lines int
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Agent  string `json:"agent"`
			Prompt string `json:"prompt"`
			Parsed string `json:"parsed"`
			Valid  bool   `json:"valid"`
			Tools  []struct {
				Name, Result, Error string
			} `json:"tools"`
			Rendered string `json:"rendered_prompt"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines++
		if len(l.Tools) > 0 {
			withTools++
			if l.Tools[0].Error == "" && (l.Tools[0].Name != "lookup" || !strings.Contains(l.Tools[0].Result, "=")) {
				t.Errorf("tool use %+v", l.Tools)
			}
		} else if l.Parsed != "" && strings.Contains(l.Rendered, "=") {
			answered++ // an answer after a tool result in its prompt
		}
	}
	if lines == 0 || withTools == 0 {
		t.Fatalf("%d calls, %d with tool calls: the warmed-up Answerer never called its tool", lines, withTools)
	}
	if answered == 0 {
		t.Errorf("no answer read a tool result (%d calls, %d with tool calls)", lines, withTools)
	}
}
