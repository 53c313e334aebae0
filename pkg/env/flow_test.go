package env

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

func mathFlow() OrchestraConfig {
	c := toyConfig("flow")
	c.InvalidActionPenalty = ptr(0.1)
	c.Flow = FlowConfig{MaxCalls: 8, Answer: "boxed", Match: MatchMath, Steps: []FlowStep{
		{Agent: "solver", Tag: "boxed", MaxCalls: 2, Next: "verifier", Last: FlowEnd},
		{Agent: "verifier", Tag: "verify", Next: FlowEnd,
			Routes: []FlowRoute{{When: "approve", Next: FlowEnd}, {When: "reject", Next: "solver"}}},
	}}
	return c
}

func searchFlow() OrchestraConfig {
	c := toyConfig("flow")
	c.InvalidActionPenalty = ptr(0.01)
	c.Flow = FlowConfig{MaxCalls: 20, Answer: "answer", Match: MatchQA, Steps: []FlowStep{
		{Agent: "verifier", Tag: "verify", MaxCalls: 4, Next: "answerer",
			Routes: []FlowRoute{{When: "no", Next: "searcher"}, {When: "yes", Next: "answerer"}}},
		{Agent: "searcher", Tag: "search", Tool: "search", Next: "verifier"},
		{Agent: "answerer", Tag: "answer"},
	}}
	return c
}

// withPrompts gives flow agents the built-in toy prompts of their roles.
func withPrompts(agents []AgentConfig, prompts ...string) []AgentConfig {
	for i := range agents {
		agents[i].Prompt = prompts[i]
	}
	return agents
}

// sameRollouts compares what two orchestras did, call by call; flows have no verifier role reward.
func sameRollouts(t *testing.T, a, b *Rollout) {
	t.Helper()
	if len(a.Trajectories) != len(b.Trajectories) {
		t.Fatalf("%d vs %d trajectories", len(a.Trajectories), len(b.Trajectories))
	}
	for i := range a.Trajectories {
		x, y := a.Trajectories[i], b.Trajectories[i]
		if x.Reward != y.Reward || x.Answer != y.Answer || x.Answered != y.Answered || x.TrajUID != y.TrajUID || len(x.Calls) != len(y.Calls) {
			t.Errorf("trajectory %d: %+v vs %+v", i, x, y)
			continue
		}
		for j := range x.Calls {
			c, d := x.Calls[j], y.Calls[j]
			if c.Agent == "verifier" {
				c.RoleReward, d.RoleReward = 0, 0
			}
			if c.Agent != d.Agent || c.Prompt != d.Prompt || c.Response != d.Response || c.Valid != d.Valid ||
				c.Parsed != d.Parsed || c.Turn != d.Turn || !approx(c.Score, d.Score) || c.RoleReward != d.RoleReward {
				t.Errorf("trajectory %d call %d: %+v vs %+v", i, j, c, d)
			}
		}
	}
}

func TestFlowExpressesMath(t *testing.T) {
	tasks := tasksOf("T0", "T1", "T2", "T3", "T4", "T5", "T6")
	agents := agentsNamed("m", "solver", "verifier")
	agents[0].Reward.RoleWeight = 0.5 // the solver's role reward (its own answer right) exists in both
	s1, s2 := &script{rule: mathRule}, &script{rule: mathRule}
	r1, err := mustOrchestra(t, toyConfig("math"), agents, nil).Run(context.Background(), s1, tasks, 2, RunOptions{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	fa := withPrompts(agentsNamed("m", "solver", "verifier"), mathSolverToy, mathVerifierToy)
	fa[0].Reward.RoleWeight = 0.5
	r2, err := mustOrchestra(t, mathFlow(), fa, nil).Run(context.Background(), s2, tasks, 2, RunOptions{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	sameRollouts(t, r1, r2)
	if !slices.Equal(s1.batches, s2.batches) || !slices.Equal(s1.seeds, s2.seeds) {
		t.Errorf("Generate calls %v vs %v (or seeds differ)", s1.batches, s2.batches)
	}
}

func TestFlowExpressesSearch(t *testing.T) {
	tasks := searchTasks("Y1", "SA", "WS", "ES", "IV", "IA", "NQ")
	ret1, ret2 := &countingRetriever{}, &countingRetriever{}
	s1, s2 := &script{rule: searchRule}, &script{rule: searchRule}
	r1, err := mustOrchestra(t, toyConfig("search"), agentsNamed("m", "verifier", "searcher", "answerer"), ret1).
		Run(context.Background(), s1, tasks, 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fa := withPrompts(agentsNamed("m", "verifier", "searcher", "answerer"), searchVerifierToy, searchSearcherToy, searchAnswererToy)
	r2, err := mustOrchestra(t, searchFlow(), fa, ret2).Run(context.Background(), s2, tasks, 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sameRollouts(t, r1, r2)
	if !slices.Equal(s1.batches, s2.batches) || !slices.Equal(ret1.batches, ret2.batches) {
		t.Errorf("Generate calls %v vs %v, retrievals %v vs %v", s1.batches, s2.batches, ret1.batches, ret2.batches)
	}
}

func TestFlowLoopBoundAndPrivate(t *testing.T) {
	c := toyConfig("flow")
	c.Flow = FlowConfig{MaxCalls: 5, Answer: "answer", Match: MatchQA, Steps: []FlowStep{
		{Agent: "writer", Tag: "answer", Next: "critic"},
		{Agent: "critic", Tag: "judge", Private: true, Next: "writer"},
	}}
	rule := func(r llm.Request) string {
		if r.Agent == "critic" {
			return "<judge>redo</judge>"
		}
		n := strings.Count(r.Messages[0].Content, "<answer>")
		return "<answer>" + []string{"1", "2", "4"}[min(n, 2)] + "</answer>"
	}
	o := mustOrchestra(t, c, agentsNamed("m", "writer", "critic"), nil)
	r, err := o.Run(context.Background(), &script{rule: rule}, tasksOf("Q1"), 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	W, C := "writer", "critic"
	tr := r.Trajectories[0]
	checkTraj(t, tr, want{[]string{W, C, W, C, W}, []bool{true, true, true, true, true}, []float64{1, 1, 1, 1, 1}, []int{1, 1, 2, 2, 3}, 1})
	if tr.Answer != "4" {
		t.Errorf("answer %q, want the last writer's", tr.Answer)
	}
	if p := tr.Calls[4].Prompt; p != "Q1<answer>1</answer><answer>2</answer>" {
		t.Errorf("a private critic reached the context, or the writer's did not: %q", p)
	}
	if p := tr.Calls[3].Prompt; p != "Q1<answer>1</answer><answer>2</answer>" {
		t.Errorf("critic prompt %q", p)
	}
}
