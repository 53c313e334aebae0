package env

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// mathBehaviour scripts each question: the Solver's response per attempt and the Verifier's verdict.
var mathBehaviour = map[string]struct{ solver, verifier []string }{
	"T0": {[]string{`\boxed{4}`}, []string{"<verify>approve</verify>"}},                          // approve, right
	"T1": {[]string{`so x=\boxed{5}`}, []string{"ok <verify>approve</verify>"}},                  // approve, wrong
	"T2": {[]string{`\boxed{3}`, `\boxed{4}`}, []string{"<verify>reject</verify>"}},              // reject, retry right
	"T3": {[]string{`\boxed{4}`, `I give up`}, []string{"<verify> REJECT </verify>"}},            // reject, invalid retry
	"T4": {[]string{`\boxed{4}`}, []string{"looks fine"}},                                        // invalid verdict = approve
	"T5": {[]string{`four`}, []string{"<verify>approve</verify>"}},                               // invalid solution
	"T6": {[]string{`\boxed{1}`, `\boxed{2}`, `\boxed{4}`}, []string{"<verify>reject</verify>"}}, // always reject
}

func mathRule(r llm.Request) string {
	b := mathBehaviour[question(r)]
	if r.Agent == "solver" {
		// Toy solver prompts carry earlier solutions (not verdicts): count attempts by their boxes or
		// by the one invalid retry text.
		prev := strings.Count(r.Messages[0].Content, `\boxed{`)
		return pick(b.solver, prev)
	}
	return pick(b.verifier, 0)
}

func TestMathBranches(t *testing.T) {
	o := mustOrchestra(t, toyConfig("math"), agentsNamed("m", "solver", "verifier"), nil)
	s := &script{rule: mathRule}
	r, err := o.Run(context.Background(), s, tasksOf("T0", "T1", "T2", "T3", "T4", "T5"), 2, RunOptions{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.batches, []string{"solver×12", "verifier×12", "solver×4"}; !slices.Equal(got, want) {
		t.Errorf("Generate calls %v, want %v", got, want)
	}
	S, V := "solver", "verifier"
	wants := []want{
		{[]string{S, V}, []bool{true, true}, []float64{1, 1}, []int{1, 1}, 1},
		{[]string{S, V}, []bool{true, true}, []float64{0, 0}, []int{1, 1}, 0},
		{[]string{S, V, S}, []bool{true, true, true}, []float64{1, 1, 1}, []int{1, 1, 2}, 1},
		{[]string{S, V, S}, []bool{true, true, false}, []float64{0, 0, -0.1}, []int{1, 1, 2}, 0},
		{[]string{S, V}, []bool{true, false}, []float64{1, 0.9}, []int{1, 1}, 1},
		{[]string{S, V}, []bool{false, true}, []float64{-0.1, 0}, []int{1, 1}, 0},
	}
	if len(r.Trajectories) != 12 {
		t.Fatalf("%d trajectories, want 12", len(r.Trajectories))
	}
	for i, tr := range r.Trajectories {
		checkTraj(t, tr, wants[i/2])
		if tr.Sample != i%2 || tr.TaskIndex != i/2 || tr.UID != r.Trajectories[i-i%2].UID {
			t.Errorf("trajectory %d: sample %d task %d uid %s", i, tr.Sample, tr.TaskIndex, tr.UID)
		}
	}
	t3 := r.Trajectories[6]
	if t3.UID != "3:idT3" || t3.TrajUID != "3:idT3#0" || t3.TaskID != "idT3" {
		t.Errorf("ids %q %q %q", t3.UID, t3.TrajUID, t3.TaskID)
	}
	if c := t3.Calls[1]; c.Parsed != "reject" {
		t.Errorf("verdict parsed as %q", c.Parsed)
	}
	if t3.Answered || t3.Answer != "" {
		t.Errorf("an invalid last attempt gives no answer, got %q", t3.Answer)
	}
	t2 := r.Trajectories[4]
	if t2.Answer != "4" || !t2.Answered {
		t.Errorf("final answer %q, want the last attempt's 4", t2.Answer)
	}
	// The retry sees the earlier solution; toy prompts leave verdicts out.
	if got := t2.Calls[2].Prompt; got != `PT2\boxed{3}` {
		t.Errorf("retry prompt %q", got)
	}
	if got := t2.Calls[1].Prompt; got != `CT2\boxed{3}` {
		t.Errorf("verifier prompt %q", got)
	}
	c := t2.Calls[0]
	if len(c.Messages) != 1 || c.Messages[0].Content != c.Prompt || c.Model != "m" ||
		!slices.Equal(c.PromptIDs, []int{len(c.Prompt)}) || !slices.Equal(c.ResponseIDs, []int{len(c.Response), 7}) ||
		!slices.Equal(c.LogProbs, []float32{-0.25, -0.5}) || c.Finish != llm.FinishStop {
		t.Errorf("call record %+v", c)
	}

	samples := r.Samples()
	if len(samples) != 28 {
		t.Fatalf("%d samples, want 28", len(samples))
	}
	for _, sm := range samples {
		tr := r.Trajectories[sm.Traj]
		if c := tr.Calls[sm.Call]; sm.Score != c.Score || sm.Agent != c.Agent || sm.UID != tr.UID || sm.TrajUID != tr.TrajUID {
			t.Errorf("sample %+v does not match its call", sm)
		}
	}
}

func TestMathLoopBound(t *testing.T) {
	cfg := toyConfig("math")
	cfg.MaxLoopNum = 3
	cfg.InvalidActionPenalty = ptr(0.5)
	o := mustOrchestra(t, cfg, agentsNamed("m", "solver", "verifier"), nil)
	s := &script{rule: mathRule}
	r, err := o.Run(context.Background(), s, tasksOf("T6", "T5"), 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	S, V := "solver", "verifier"
	checkTraj(t, r.Trajectories[0], want{[]string{S, V, S, V, S}, []bool{true, true, true, true, true},
		[]float64{1, 1, 1, 1, 1}, []int{1, 1, 2, 2, 3}, 1})
	checkTraj(t, r.Trajectories[1], want{[]string{S, V}, []bool{false, true}, []float64{-0.5, 0}, nil, 0})
	if got := r.Trajectories[0].Calls[4].Prompt; got != `PT6\boxed{1}\boxed{2}` {
		t.Errorf("third attempt prompt %q", got)
	}
	if got, want := s.batches, []string{"solver×2", "verifier×2", "solver×1", "verifier×1", "solver×1"}; !slices.Equal(got, want) {
		t.Errorf("Generate calls %v, want %v", got, want)
	}
}

func TestMathRoleRewards(t *testing.T) {
	agents := agentsNamed("m", "solver", "verifier")
	agents[0].Reward.RoleWeight = 0.5
	agents[1].Reward.RoleWeight = 0.5
	o := mustOrchestra(t, toyConfig("math"), agents, nil)
	r, err := o.Run(context.Background(), &script{rule: mathRule}, tasksOf("T1", "T2", "T3", "T4"), 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type roleScore struct{ role, score []float64 }
	wants := []roleScore{
		{[]float64{0, 0}, []float64{0, 0}},            // approved a wrong answer
		{[]float64{0, 1, 1}, []float64{0.5, 1, 1}},    // rejected a wrong answer, then right
		{[]float64{1, 0, 0}, []float64{0.5, 0, -0.1}}, // rejected a right answer
		{[]float64{1, 0}, []float64{1, 0.5 - 0.1}},    // invalid verdict: no role reward
	}
	for i, w := range wants {
		var role, score []float64
		for _, c := range r.Trajectories[i].Calls {
			role, score = append(role, c.RoleReward), append(score, c.Score)
		}
		if !slices.Equal(role, w.role) || !slices.EqualFunc(score, w.score, approx) {
			t.Errorf("task %d: role %v score %v, want %v %v", i, role, score, w.role, w.score)
		}
	}
}

func TestMathSeedsDeterministic(t *testing.T) {
	o := mustOrchestra(t, toyConfig("math"), agentsNamed("m", "solver", "verifier"), nil)
	run := func(opts RunOptions) []int64 {
		s := &script{rule: mathRule}
		if _, err := o.Run(context.Background(), s, tasksOf("T2", "T3", "T0"), 4, opts); err != nil {
			t.Fatal(err)
		}
		return s.seeds
	}
	a, b := run(RunOptions{Seed: 7, Iteration: 3}), run(RunOptions{Seed: 7, Iteration: 3})
	if !slices.Equal(a, b) {
		t.Error("a rerun drew different seeds")
	}
	distinct := map[int64]bool{}
	for _, s := range a {
		distinct[s] = true
	}
	if len(distinct) != len(a) {
		t.Errorf("%d distinct seeds for %d requests", len(distinct), len(a))
	}
	if c := run(RunOptions{Seed: 7, Iteration: 4}); slices.Equal(a, c) {
		t.Error("another iteration drew the same seeds")
	}
}

func TestMathPaperPrompts(t *testing.T) {
	cfg := DefaultOrchestraConfig()
	cfg.Type = "math"
	o := mustOrchestra(t, cfg, agentsNamed("m", "solver", "verifier"), nil)
	rule := func(r llm.Request) string {
		if r.Agent == "verifier" {
			return "<verify>reject</verify>"
		}
		return `\boxed{3}`
	}
	r, err := o.Run(context.Background(), &script{rule: rule}, []Task{{ID: "x", Question: "What is 2+2?", Answers: []string{"4"}}}, 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	calls := r.Trajectories[0].Calls
	for _, sub := range []string{"What is 2+2?", `The output of "solver": \boxed{3}`,
		`The output of "verifier": <verify>reject</verify>`, "rejected", "attempt 2 of 2"} {
		if !strings.Contains(calls[2].Prompt, sub) {
			t.Errorf("retry prompt lacks %q:\n%s", sub, calls[2].Prompt)
		}
	}
	if !strings.Contains(calls[1].Prompt, "# Solution under review\n\\boxed{3}") {
		t.Errorf("verifier prompt lacks the solution:\n%s", calls[1].Prompt)
	}
	if strings.Contains(calls[0].Prompt, "teammates") {
		t.Errorf("first attempt prompt shows an empty team context:\n%s", calls[0].Prompt)
	}
}

// RunOptions.Progress hears of the start and of each trajectory as it finishes: the 10 approved in the first loop
// after the Verifier's turn, the 2 retried after the second Solver turn, each exactly once.
func TestRunProgress(t *testing.T) {
	o := mustOrchestra(t, toyConfig("math"), agentsNamed("m", "solver", "verifier"), nil)
	var seen [][2]int
	_, err := o.Run(context.Background(), &script{rule: mathRule}, tasksOf("T0", "T1", "T2", "T3", "T4", "T5"), 2,
		RunOptions{Seed: 3, Progress: func(done, total int) { seen = append(seen, [2]int{done, total}) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 13 {
		t.Fatalf("progress reported %d times, want 13 (the start, then one per trajectory): %v", len(seen), seen)
	}
	for i, s := range seen {
		if s != [2]int{i, 12} {
			t.Fatalf("report %d: %v, want [%d 12]", i, s, i)
		}
	}
}
