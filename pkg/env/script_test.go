package env

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/rs/zerolog"
)

func TestMain(m *testing.M) {
	zerolog.SetGlobalLevel(zerolog.WarnLevel)
	os.Exit(m.Run())
}

// script is a scripted policy: it answers each request by a rule and records every Generate call.
type script struct {
	rule    func(r llm.Request) string
	batches []string // "agent×n" per Generate call
	seeds   []int64
}

func (s *script) Generate(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		if r.Agent != reqs[0].Agent {
			return nil, fmt.Errorf("one Generate call mixed agents %q and %q", reqs[0].Agent, r.Agent)
		}
		if len(r.Messages) != 1 || r.Messages[0].Role != "user" {
			return nil, fmt.Errorf("unexpected messages %+v", r.Messages)
		}
		text := s.rule(r)
		out[i] = llm.Completion{Text: text, PromptIDs: []int{len(r.Messages[0].Content)},
			ResponseIDs: []int{len(text), 7}, LogProbs: []float32{-0.25, -0.5}, Finish: llm.FinishStop}
		s.seeds = append(s.seeds, r.Sampling.Seed)
	}
	s.batches = append(s.batches, fmt.Sprintf("%s×%d", reqs[0].Agent, len(reqs)))
	return out, nil
}

// pick returns list[i], or its last element past the end.
func pick(list []string, i int) string { return list[min(i, len(list)-1)] }

// want is the expected shape of one trajectory.
type want struct {
	agents []string
	valid  []bool
	scores []float64
	turns  []int
	reward float64
}

func checkTraj(t *testing.T, tr Trajectory, w want) {
	t.Helper()
	var agents []string
	var valid []bool
	var scores []float64
	var turns []int
	for _, c := range tr.Calls {
		agents, valid, scores, turns = append(agents, c.Agent), append(valid, c.Valid), append(scores, c.Score), append(turns, c.Turn)
	}
	if !slices.Equal(agents, w.agents) {
		t.Errorf("%s: agents %v, want %v", tr.TrajUID, agents, w.agents)
	}
	if !slices.Equal(valid, w.valid) {
		t.Errorf("%s: valid %v, want %v", tr.TrajUID, valid, w.valid)
	}
	if !slices.EqualFunc(scores, w.scores, approx) {
		t.Errorf("%s: scores %v, want %v", tr.TrajUID, scores, w.scores)
	}
	if w.turns != nil && !slices.Equal(turns, w.turns) {
		t.Errorf("%s: turns %v, want %v", tr.TrajUID, turns, w.turns)
	}
	if tr.Reward != w.reward || tr.Success != (w.reward == 1) {
		t.Errorf("%s: reward %g success %v, want %g", tr.TrajUID, tr.Reward, tr.Success, w.reward)
	}
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func ptr[T any](v T) *T { return &v }

// question returns the two-character question id of a toy prompt (role letter, then the question).
func question(r llm.Request) string { return r.Messages[0].Content[1:3] }

func mustOrchestra(t testing.TB, cfg OrchestraConfig, agents []AgentConfig, retr Retriever) Orchestra {
	t.Helper()
	o, err := NewOrchestra(cfg, agents, retr)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func toyConfig(typ string) OrchestraConfig {
	c := DefaultOrchestraConfig()
	c.Type, c.Prompts = typ, PromptsToy
	return c
}

func agentsNamed(model string, names ...string) []AgentConfig {
	out := make([]AgentConfig, len(names))
	for i, n := range names {
		out[i] = AgentConfig{Name: n, Model: model}
	}
	return out
}

func tasksOf(ids ...string) []Task {
	out := make([]Task, len(ids))
	for i, id := range ids {
		out[i] = Task{ID: "id" + id, Question: id, Answers: []string{"4"}}
	}
	return out
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
