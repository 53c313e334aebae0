package check

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
)

// longest is a stand-in policy that answers every call with a response of exactly its
// max_new_tokens tokens (the verifier's rejects, so episodes run their full course) and records the
// longest encoded prompt each agent gets, first calls apart.
type longest struct {
	pc           *Prompts
	first, any   map[string]int
	seen         map[string]bool // trajectories' first calls seen, per agent and task
	fill, reject string
}

func (g *longest) Generate(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		m := g.pc.models[r.Model]
		text, err := m.chat.RenderWith(r.Messages, true, r.ChatTemplateKwargs)
		if err != nil {
			return nil, err
		}
		n := len(m.tok.Encode(text))
		g.any[r.Agent] = max(g.any[r.Agent], n)
		if r.Agent == "solver" && !strings.Contains(text, g.fill) { // no team output yet: a first turn
			g.first[r.Agent] = max(g.first[r.Agent], n)
		}
		resp := g.fill
		if r.Agent == "verifier" {
			resp = g.reject
		}
		for len(m.tok.Encode(resp+"x")) <= r.Sampling.MaxNewTokens {
			resp += "x"
		}
		out[i] = llm.Completion{Text: resp}
	}
	return out, nil
}

// MeasurePrompts gives each agent's longest first-turn prompt exactly (the solver's first calls of
// a real rollout over the data, encoded as the policy does, reach it and no more) and a bound that
// no call of a rollout whose every response is max_new_tokens long exceeds; the plan takes that
// bound. The over-long record that data.filter_overlong_prompts skips is not measured.
func TestMeasurePrompts(t *testing.T) {
	data := filepath.Join(t.TempDir(), "train.jsonl")
	questions := []string{"1 + 1", "12 + 345 * 6", "7 * 8 - 9 + 10", strings.Repeat("9", 3000)}
	writeLines(t, data, questions...)
	cfg := tinyConfig(t, "toy.task=''", "warmup.steps=0", "data.train="+data, "data.filter_overlong_prompts=true",
		"agents.0.sampling.max_new_tokens=24", "agents.1.sampling.max_new_tokens=32", "orchestra.max_loop_num=3")
	got, err := MeasurePrompts(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Agent != "solver" || got[1].Agent != "verifier" || got[0].MaxNewTokens != 24 || got[1].MaxNewTokens != 32 {
		t.Fatalf("measured %+v", got)
	}
	pc, err := NewPrompts(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := &longest{pc: pc, first: map[string]int{}, any: map[string]int{}, fill: "42", reject: "<verify>reject</verify>"}
	var tasks []env.Task
	for i, q := range questions[:3] {
		tasks = append(tasks, env.Task{ID: string(rune('a' + i)), Question: q, Answers: []string{"0"}})
	}
	if _, err := pc.orch.Run(context.Background(), g, tasks, 2, env.RunOptions{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if got[0].FirstTurn != g.first["solver"] {
		t.Errorf("solver's first turn: measured %d, the rollout's longest first call %d", got[0].FirstTurn, g.first["solver"])
	}
	for _, m := range got {
		if m.Bound <= 0 || g.any[m.Agent] > m.Bound || m.FirstTurn > g.any[m.Agent] {
			t.Errorf("%s: first turn %d, bound %d; the rollout's longest call %d", m.Agent, m.FirstTurn, m.Bound, g.any[m.Agent])
		}
		if m.FirstTurn >= 3000 {
			t.Errorf("%s: the skipped record was measured (%d)", m.Agent, m.FirstTurn)
		}
	}
	if g.any["verifier"] <= got[1].FirstTurn { // later turns did grow
		t.Errorf("verifier: the rollout's longest call %d is no longer than its first turn %d", g.any["verifier"], got[1].FirstTurn)
	}
}

// writeLines writes a JSON lines dataset of (question, answer) records.
func writeLines(t *testing.T, path string, questions ...string) {
	t.Helper()
	var b strings.Builder
	for i, q := range questions {
		fmt.Fprintf(&b, "{\"id\": \"t%d\", \"question\": %q, \"answer\": \"%d\"}\n", i+1, q, i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
