package env

import (
	"context"
	"fmt"
	"testing"
)

// Openings are what episodes really send first: every trajectory's first call (its agent and
// prompt) is among its task's openings, in math, in search with and without a curriculum that
// forces searches and injects facts, and in a flow.
func TestOpeningsAreTheFirstPrompts(t *testing.T) {
	curriculum := toyConfig("search")
	curriculum.Curriculum = CurriculumConfig{Inject: Ramp{P0: 0.5, Hold: 100}, ForceSearch: Ramp{P0: 0.5, Hold: 100}}
	flowAgents := withPrompts(agentsNamed("m", "verifier", "searcher", "answerer"), searchVerifierToy, searchSearcherToy, searchAnswererToy)
	math := tasksOf("T0", "T1", "T2")
	search := searchTasks("Y1", "SA", "WS", "ES")
	for _, c := range []struct {
		name     string
		o        Orchestra
		gen      *script
		tasks    []Task
		openings int
	}{
		{"math", mustOrchestra(t, toyConfig("math"), agentsNamed("m", "solver", "verifier"), nil), &script{rule: mathRule}, math, 1},
		{"search", mustOrchestra(t, toyConfig("search"), agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{}), &script{rule: searchRule}, search, 1},
		{"search curriculum", mustOrchestra(t, curriculum, agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{}), &script{rule: searchRule}, search, 4},
		{"flow", mustOrchestra(t, searchFlow(), flowAgents, FactRetriever{}), &script{rule: searchRule}, search, 1},
	} {
		r, err := c.o.Run(context.Background(), c.gen, c.tasks, 8, RunOptions{Seed: 3, Iteration: 1})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, tr := range r.Trajectories {
			ops, err := Openings(c.o, c.tasks[tr.TaskIndex])
			if err != nil {
				t.Fatal(err)
			}
			if len(ops) != c.openings {
				t.Errorf("%s: %d openings, want %d", c.name, len(ops), c.openings)
			}
			first := tr.Calls[0]
			found := false
			for _, op := range ops {
				found = found || (op.Agent.Name == first.Agent && op.Prompt == first.Prompt)
			}
			if !found {
				t.Errorf("%s: %s's first call %s %q is not among its openings %+v", c.name, tr.TrajUID, first.Agent, first.Prompt, ops)
			}
			seen[fmt.Sprint(first.Agent, len(first.Prompt))] = true
		}
		if c.openings > 1 && len(seen) < 3 {
			t.Errorf("%s: the run opened in only %d ways: the curriculum did not vary", c.name, len(seen))
		}
	}
}
