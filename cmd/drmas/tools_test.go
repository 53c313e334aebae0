package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/tool/tooltest"
	"gopkg.in/yaml.v3"
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

// docs/tools.md's own example runs end to end (#52: its dry run and its training stopped with
// `memory plan: … unknown tool "get-sum"`, the plan's prompt measurement building the flow without
// the MCP servers): the YAML block as the page writes it, over the toy tool team's model and data,
// with its two MCP servers — server-everything over stdio (node and the npm package instead of npx's
// download) and over streamable HTTP at the url (a loopback port, key_env set), each offering tools
// of its own (servers[].tools) — through --dry-run
// (the memory plan included) and a training iteration.
func TestToolsDocExampleRuns(t *testing.T) {
	node, entry := tooltest.Everything(t, "../../")
	url := tooltest.EverythingHTTP(t, node, entry)
	doc, err := os.ReadFile("../../docs/tools.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(doc)
	if block == nil {
		t.Fatal("docs/tools.md has no yaml block")
	}
	var ex map[string]any
	if err := yaml.Unmarshal(block[1], &ex); err != nil {
		t.Fatalf("docs/tools.md's example: %v", err)
	}
	servers := ex["tools"].(map[string]any)["mcp_servers"].([]any)
	if len(servers) != 2 {
		t.Fatalf("the example's servers changed: %v (update this test)", servers)
	}
	// Both are the one test server here: each offers its own tools (a real web server has others).
	servers[0].(map[string]any)["command"], servers[0].(map[string]any)["args"] = node, []any{entry, "stdio"}
	servers[0].(map[string]any)["tools"] = []any{"get-sum", "echo"}
	servers[1].(map[string]any)["url"], servers[1].(map[string]any)["tools"] = url, []any{"get-tiny-image"}
	t.Setenv("WEB_MCP_KEY", "a key the test server ignores")
	dir := t.TempDir()
	raw, err := os.ReadFile("../../configs/toy-tool-team.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var merged map[string]any
	if err := yaml.Unmarshal(raw, &merged); err != nil {
		t.Fatal(err)
	}
	for k, v := range ex { // the page's sections replace the toy team's
		merged[k] = v
	}
	out, err := yaml.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "tools-example.yaml")
	if err := os.WriteFile(cfg, out, 0o644); err != nil {
		t.Fatal(err)
	}
	sets := []string{"--set", "models.0.id=policy", "--set", "models.0.tokenizer=../../configs/toy/tokenizer.json", "--set", "run.dir=" + filepath.Join(dir, "run"),
		"--set", "run.steps=1", "--set", "run.test_freq=0", "--set", "run.dump_every=1", "--set", "warmup.steps=0", "--set", "algorithm.batch_size=2",
		"--set", "algorithm.group_size=2", "--set", "agents.0.sampling.max_new_tokens=16", "--set", "toy.train=16", "--set", "toy.val=4"}
	if _, stderr, err := execDrmas(t, append([]string{"train", "--config", cfg, "--dry-run"}, sets...)...); err != nil {
		t.Fatalf("the example's dry run: %v\n%s", err, stderr)
	}
	if _, stderr, err := execDrmas(t, append([]string{"train", "--config", cfg}, sets...)...); err != nil {
		t.Fatalf("the example's training: %v\n%s", err, stderr)
	}
	dump, err := os.ReadFile(filepath.Join(dir, "run", "rollouts", "step-1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(dump), "\n"); n < 4 {
		t.Errorf("the iteration's rollout dump holds %d calls, want its 4 episodes'", n)
	}
}
