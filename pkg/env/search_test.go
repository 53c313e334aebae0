package env

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// searchBehaviour scripts each question: the Verifier's verdict, the Searcher's response and the
// Answerer's response per turn.
var searchBehaviour = map[string]struct {
	verifier, searcher []string
	answerer           string
}{
	"Y1": {[]string{"<verify>yes</verify>"}, []string{"<search>k</search>"}, "<answer>7</answer>"},                        // answers blind
	"SA": {[]string{"<verify>no</verify>", "<verify>yes</verify>"}, []string{"<search>k</search>"}, "<answer>7</answer>"}, // search, answer
	"WS": {[]string{"<verify>no</verify>", "<verify>yes</verify>"}, []string{"<search>m</search>"}, "<answer>3</answer>"}, // wrong key
	"ES": {[]string{"<verify>no</verify>"}, []string{"<search> </search>"}, ""},                                           // empty queries to the turn limit
	"IV": {[]string{"maybe"}, nil, "<answer>The 7.</answer>"},                                                             // invalid verdict = yes
	"IA": {[]string{"<verify>yes</verify>"}, nil, "7"},                                                                    // invalid answer
	"NQ": {[]string{"<verify>no</verify>", "<verify>no</verify>", "<verify>yes</verify>"},
		[]string{"zz search k", "<search> K </search>"}, "<answer>7</answer>"}, // no tags, then a good query
}

func searchRule(r llm.Request) string {
	b := searchBehaviour[question(r)]
	p := r.Messages[0].Content
	turn := strings.Count(p, "</search>") + strings.Count(p, "zz") // searches so far
	switch r.Agent {
	case "verifier":
		return pick(b.verifier, turn)
	case "searcher":
		return pick(b.searcher, turn)
	}
	return b.answerer
}

func searchTasks(ids ...string) []Task {
	out := make([]Task, len(ids))
	for i, id := range ids {
		out[i] = Task{ID: "id" + id, Question: id, Answers: []string{"7"}, Facts: []string{"k=7", "m=3"}, Support: []string{"k=7"}}
	}
	return out
}

// countingRetriever records the size of each batch of queries.
type countingRetriever struct {
	FactRetriever
	batches []int
}

func (c *countingRetriever) RetrieveTasks(ctx context.Context, tasks []Task, queries []string, topk int) ([][]Doc, error) {
	c.batches = append(c.batches, len(queries))
	return c.FactRetriever.RetrieveTasks(ctx, tasks, queries, topk)
}

func TestSearchBranches(t *testing.T) {
	retr := &countingRetriever{}
	o := mustOrchestra(t, toyConfig("search"), agentsNamed("m", "verifier", "searcher", "answerer"), retr)
	s := &script{rule: searchRule}
	r, err := o.Run(context.Background(), s, searchTasks("Y1", "SA", "WS", "ES", "IV", "IA", "NQ"), 1, RunOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	wantBatches := []string{"verifier×7", "searcher×4", "answerer×3", "verifier×4", "searcher×2", "answerer×2",
		"verifier×2", "searcher×1", "answerer×1", "verifier×1", "searcher×1"}
	if !slices.Equal(s.batches, wantBatches) {
		t.Errorf("Generate calls %v, want %v", s.batches, wantBatches)
	}
	if !slices.Equal(retr.batches, []int{2, 1}) {
		t.Errorf("retrieval batches %v, want [2 1] (invalid searches retrieve nothing)", retr.batches)
	}
	V, S, A := "verifier", "searcher", "answerer"
	T, F := true, false
	const p = 0.01
	wants := []want{
		{[]string{V, A}, []bool{T, T}, []float64{1, 1}, []int{1, 1}, 1},
		{[]string{V, S, V, A}, []bool{T, T, T, T}, []float64{1, 1, 1, 1}, []int{1, 1, 2, 2}, 1},
		{[]string{V, S, V, A}, []bool{T, T, T, T}, []float64{0, 0, 0, 0}, []int{1, 1, 2, 2}, 0},
		{[]string{V, S, V, S, V, S, V, S}, []bool{T, F, T, F, T, F, T, F},
			[]float64{0, -p, 0, -p, 0, -p, 0, -p}, []int{1, 1, 2, 2, 3, 3, 4, 4}, 0},
		{[]string{V, A}, []bool{F, T}, []float64{1 - p, 1}, nil, 1},
		{[]string{V, A}, []bool{T, F}, []float64{0, -p}, nil, 0},
		{[]string{V, S, V, S, V, A}, []bool{T, F, T, T, T, T}, []float64{1, 1 - p, 1, 1, 1, 1}, []int{1, 1, 2, 2, 3, 3}, 1},
	}
	for i, tr := range r.Trajectories {
		checkTraj(t, tr, wants[i])
	}
	sa := r.Trajectories[1]
	if got := sa.Calls[3].Prompt; got != "ASA<search>k</search><information>k=7</information>" {
		t.Errorf("answerer prompt %q", got)
	}
	if got := sa.Calls[2].Prompt; got != "VSA<search>k</search><information>k=7</information>" {
		t.Errorf("second verifier prompt %q", got)
	}
	if sa.Answer != "7" || !sa.Answered {
		t.Errorf("answer %q", sa.Answer)
	}
	es := r.Trajectories[3]
	if es.Answered || strings.Contains(es.Calls[7].Prompt, "<information>") {
		t.Errorf("empty queries retrieved something or answered: %+v", es.Calls[7])
	}
	if got := r.Trajectories[6].Calls[3].Parsed; got != "K" {
		t.Errorf("query parsed as %q", got)
	}
	// Role rewards: verifier verdict vs "the needed fact is in context", searcher hit, answerer right.
	roles := func(i int) []float64 {
		var out []float64
		for _, c := range r.Trajectories[i].Calls {
			out = append(out, c.RoleReward)
		}
		return out
	}
	for i, w := range map[int][]float64{
		0: {0, 1},       // yes with nothing retrieved: wrong verdict; the blind answer is right
		1: {1, 1, 1, 1}, // no, hit, yes with the fact, right
		2: {1, 0, 0, 0}, // no, miss, yes without the fact, wrong answer
		4: {0, 1},       // invalid verdict earns nothing
		6: {1, 0, 1, 1, 1, 1},
	} {
		if got := roles(i); !slices.Equal(got, w) {
			t.Errorf("trajectory %d role rewards %v, want %v", i, got, w)
		}
	}
}

func TestSearchTurnLimit(t *testing.T) {
	cfg := toyConfig("search")
	cfg.MaxTurns = 2
	o := mustOrchestra(t, cfg, agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{})
	r, err := o.Run(context.Background(), &script{rule: searchRule}, searchTasks("NQ", "SA"), 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	V, S, A := "verifier", "searcher", "answerer"
	checkTraj(t, r.Trajectories[0], want{[]string{V, S, V, S}, []bool{true, false, true, true},
		[]float64{0, -0.01, 0, 0}, []int{1, 1, 2, 2}, 0})
	checkTraj(t, r.Trajectories[1], want{[]string{V, S, V, A}, []bool{true, true, true, true},
		[]float64{1, 1, 1, 1}, nil, 1})
}

func TestSearchRoleWeights(t *testing.T) {
	agents := agentsNamed("m", "verifier", "searcher", "answerer")
	agents[0].Reward.RoleWeight, agents[1].Reward.RoleWeight = 0.5, 1
	o := mustOrchestra(t, toyConfig("search"), agents, FactRetriever{})
	r, err := o.Run(context.Background(), &script{rule: searchRule}, searchTasks("Y1", "WS"), 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkTraj(t, r.Trajectories[0], want{[]string{"verifier", "answerer"}, []bool{true, true}, []float64{0.5, 1}, nil, 1})
	// WS: verifier no (right) 0.5, searcher missed 0, verifier yes without the fact 0, answer wrong 0.
	checkTraj(t, r.Trajectories[1], want{[]string{"verifier", "searcher", "verifier", "answerer"},
		[]bool{true, true, true, true}, []float64{0.5, 0, 0, 0}, nil, 0})
}

// fixedRetriever is a plain Retriever that returns the same documents for every query.
type fixedRetriever struct{ docs []Doc }

func (f fixedRetriever) Retrieve(_ context.Context, queries []string, topk int) ([][]Doc, error) {
	out := make([][]Doc, len(queries))
	for i := range out {
		out[i] = f.docs[:min(topk, len(f.docs))]
	}
	return out, nil
}

func TestSearchPlainRetrieverPaperPrompts(t *testing.T) {
	cfg := DefaultOrchestraConfig()
	cfg.Type, cfg.TopK = "search", 2
	retr := fixedRetriever{docs: []Doc{{ID: "1", Contents: "Paris is the capital of France."}, {ID: "2", Contents: "Lyon."}, {ID: "3", Contents: "Nice."}}}
	o := mustOrchestra(t, cfg, agentsNamed("m", "verifier", "searcher", "answerer"), retr)
	rule := func(r llm.Request) string {
		p := r.Messages[0].Content
		switch {
		case r.Agent == "searcher":
			return "<think>need it</think><search>capital of France</search>"
		case r.Agent == "answerer":
			return "<answer>paris</answer>"
		case strings.Contains(p, "<information>"):
			return "<verify>yes</verify>"
		}
		return "<verify>no</verify>"
	}
	task := Task{ID: "q", Question: "What is the capital of France?", Answers: []string{"Paris"}}
	r, err := o.Run(context.Background(), &script{rule: rule}, []Task{task}, 1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := r.Trajectories[0]
	checkTraj(t, tr, want{[]string{"verifier", "searcher", "verifier", "answerer"}, []bool{true, true, true, true}, []float64{1, 1, 1, 1}, nil, 1})
	if tr.Calls[1].RoleReward != 1 || tr.Calls[2].RoleReward != 1 {
		t.Errorf("without Support, a document holding the answer is a hit: %v %v", tr.Calls[1].RoleReward, tr.Calls[2].RoleReward)
	}
	p := tr.Calls[3].Prompt
	for _, sub := range []string{"Question: What is the capital of France?", `The output of "searcher": <think>need it</think><search>capital of France</search>`,
		"<information>\nDoc 1: Paris is the capital of France.\nDoc 2: Lyon.\n</information>", "<answer>"} {
		if !strings.Contains(p, sub) {
			t.Errorf("answerer prompt lacks %q:\n%s", sub, p)
		}
	}
	if strings.Contains(p, "Nice.") {
		t.Error("more than topk documents reached the prompt")
	}
}

func TestSearchCurriculum(t *testing.T) {
	cfg := toyConfig("search")
	cfg.Curriculum = CurriculumConfig{Inject: Ramp{P0: 1, Hold: 10}, ForceSearch: Ramp{P0: 1, Hold: 10}}
	o := mustOrchestra(t, cfg, agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{})
	run := func(opts RunOptions, ids ...string) *Rollout {
		r, err := o.Run(context.Background(), &script{rule: searchRule}, searchTasks(ids...), 1, opts)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := run(RunOptions{Iteration: 5}, "Y1", "WS")
	if r.Schedule != (Schedule{InjectP: 1, ForceSearchP: 1}) {
		t.Errorf("schedule %+v", r.Schedule)
	}
	// Y1 is forced to search first (its searcher repeats "k"), then says yes and answers; the
	// injected fact is in the whole team's context from turn 1 and counts for the verifier.
	y1 := r.Trajectories[0]
	if !y1.Forced || !y1.Injected {
		t.Fatalf("flags forced=%v injected=%v", y1.Forced, y1.Injected)
	}
	checkTraj(t, y1, want{[]string{"searcher", "verifier", "answerer"}, []bool{true, true, true}, []float64{1, 1, 1}, []int{1, 2, 2}, 1})
	if got := y1.Calls[2].Prompt; got != "AY1<information>k=7</information><search>k</search><information>k=7</information>" {
		t.Errorf("answerer prompt %q", got)
	}
	if got := y1.Calls[0].Prompt; got != "SY1<information>k=7</information>" {
		t.Errorf("searcher prompt %q: want the injected fact in view", got)
	}
	// WS searches the wrong key; its verifier's "yes" is still right, the injected fact being in view.
	if ws := r.Trajectories[1]; ws.Calls[1].Agent != "verifier" || ws.Calls[1].RoleReward != 1 || ws.Calls[0].RoleReward != 0 {
		t.Errorf("WS calls %+v: want the searcher's role reward 0 (missed) and the verifier's 1", ws.Calls)
	}
	for _, opts := range []RunOptions{{Iteration: 5, Eval: true}, {Iteration: 11}} {
		r := run(opts, "Y1")
		if tr := r.Trajectories[0]; tr.Forced || tr.Injected || tr.Calls[0].Agent != "verifier" || r.Schedule != (Schedule{}) {
			t.Errorf("%+v: curriculum applied: %+v", opts, tr)
		}
	}

	cfg.Curriculum = CurriculumConfig{Inject: Ramp{P0: 0.5, Hold: 100}, ForceSearch: Ramp{P0: 0.25, Hold: 100}}
	o = mustOrchestra(t, cfg, agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{})
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = "SA"
	}
	tasks := searchTasks(ids...)
	for i := range tasks {
		tasks[i].ID = fmt.Sprint(i)
	}
	count := func() (inj, forced int) {
		r, err := o.Run(context.Background(), &script{rule: searchRule}, tasks, 4, RunOptions{Seed: 9, Iteration: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range r.Trajectories {
			inj += int(b2f(tr.Injected))
			forced += int(b2f(tr.Forced))
		}
		return
	}
	inj, forced := count()
	if inj < 160 || inj > 240 || forced < 70 || forced > 130 {
		t.Errorf("of 400 episodes, %d injected (p 0.5) and %d forced (p 0.25)", inj, forced)
	}
	if i2, f2 := count(); i2 != inj || f2 != forced {
		t.Error("curriculum draws differ between reruns")
	}
}

func TestSearchNeedsRetriever(t *testing.T) {
	if _, err := NewOrchestra(toyConfig("search"), agentsNamed("m", "verifier", "searcher", "answerer"), nil); err == nil ||
		!strings.Contains(err.Error(), "retriever") {
		t.Errorf("err = %v", err)
	}
}
