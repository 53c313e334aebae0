package toy_test

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/rs/zerolog"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/toy"
)

func TestMain(m *testing.M) {
	zerolog.SetGlobalLevel(zerolog.WarnLevel)
	os.Exit(m.Run())
}

func config(task string) toy.Config {
	c := toy.Defaults()
	c.Task, c.Train, c.Val = task, 256, 64
	return c
}

func orchestra(t *testing.T, task string) env.Orchestra {
	t.Helper()
	oc, agents, err := toy.Orchestra(task)
	if err != nil {
		t.Fatal(err)
	}
	o, err := env.NewOrchestra(oc, agents, env.FactRetriever{})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func tasks(t *testing.T, c toy.Config, split string) []env.Task {
	t.Helper()
	ts, err := toy.Tasks(c, split)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func TestTasksDeterministic(t *testing.T) {
	for _, task := range []string{toy.Math, toy.Search} {
		c := config(task)
		a, b := tasks(t, c, toy.Train), tasks(t, c, toy.Train)
		if !reflect.DeepEqual(a, b) || len(a) != 256 {
			t.Errorf("%s: two draws differ (or wrong size %d)", task, len(a))
		}
		v := tasks(t, c, toy.Val)
		if len(v) != 64 || reflect.DeepEqual(a[:64], v) || v[0].ID != task+"-val-0" {
			t.Errorf("%s: val split is not its own draw: %+v", task, v[0])
		}
		c.Seed = 2
		if reflect.DeepEqual(a, tasks(t, c, toy.Train)) {
			t.Errorf("%s: the seed does not change the data", task)
		}
	}
	if _, err := toy.Tasks(config(toy.Math), "test"); err == nil {
		t.Error("an unknown split was accepted")
	}
}

func TestMathTasks(t *testing.T) {
	if toy.MathAnswer(3, '-', 5, 10) != 8 || toy.MathAnswer(7, '*', 8, 10) != 6 || toy.MathAnswer(4, '+', 3, 5) != 2 {
		t.Error("MathAnswer")
	}
	c := config(toy.Math)
	c.Modulus, c.Ops = 7, "-*"
	for _, task := range tasks(t, c, toy.Train) {
		q := task.Question
		a, op, b := int(q[0]-'0'), q[1], int(q[2]-'0')
		if len(q) != 3 || a >= 7 || b >= 7 || (op != '-' && op != '*') {
			t.Fatalf("question %q", q)
		}
		if want := strconv.Itoa(toy.MathAnswer(a, op, b, 7)); task.Answers[0] != want {
			t.Fatalf("%q: answer %s, want %s", q, task.Answers[0], want)
		}
	}
}

func TestSearchTasks(t *testing.T) {
	c := config(toy.Search)
	values := map[string]bool{}
	for _, task := range tasks(t, c, toy.Train) {
		key := strings.TrimSuffix(task.Question, "?")
		if len(task.Facts) != c.Keys || len(task.Support) != 1 || task.Support[0] != key+"="+task.Answers[0] {
			t.Fatalf("task %+v", task)
		}
		found := false
		for i, f := range task.Facts {
			if !strings.HasPrefix(f, toy.Key(i)+"=") {
				t.Fatalf("fact %d is %q", i, f)
			}
			found = found || f == task.Support[0]
		}
		if !found {
			t.Fatalf("the needed fact is not among the task's facts: %+v", task)
		}
		values[task.Facts[0]] = true
	}
	if len(values) < c.Values {
		t.Errorf("key a took only %d values across questions: memorisable", len(values))
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		mut  func(c *toy.Config)
		want string
	}{
		{func(c *toy.Config) { c.Task = "" }, "toy.task"},
		{func(c *toy.Config) { c.Train = 0 }, "toy.train: must be ≥ 1"},
		{func(c *toy.Config) { c.Val = -1 }, "toy.val"},
		{func(c *toy.Config) { c.Modulus = 11 }, "toy.modulus"},
		{func(c *toy.Config) { c.Ops = "+/" }, "toy.ops"},
		{func(c *toy.Config) { c.Keys = 27 }, "toy.keys"},
		{func(c *toy.Config) { c.Values = 1 }, "toy.values"},
	}
	for _, tc := range cases {
		c := config(toy.Search)
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	if _, _, err := toy.Orchestra("toy-chess"); err == nil {
		t.Error("an unknown toy task was accepted")
	}
}

// countTokens counts the tokens of a char-level tokenizer with AddedTokens as single tokens and
// reports characters outside its vocabulary.
func countTokens(s string) (n int, unknown string) {
	added := toy.AddedTokens()
	for len(s) > 0 {
		n++
		matched := false
		for _, a := range added {
			if strings.HasPrefix(s, a) {
				s, matched = s[len(a):], true
				break
			}
		}
		if !matched {
			r, size := utf8.DecodeRuneInString(s)
			if !strings.ContainsRune(toy.Alphabet, r) {
				unknown += string(r)
			}
			s = s[size:]
		}
	}
	return n, unknown
}

// run plays a toy task with a policy, at training iteration 0 (curriculum on) or as evaluation.
func run(t *testing.T, task string, gen llm.Generator, n int, eval bool) *env.Rollout {
	t.Helper()
	r, err := orchestra(t, task).Run(context.Background(), gen, tasks(t, config(task), toy.Train), n, env.RunOptions{Seed: 4, Eval: eval})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPromptsShortAndCovered(t *testing.T) {
	for _, task := range []string{toy.Math, toy.Search} {
		maxPrompt, maxResp := 0, 0
		for _, eval := range []bool{false, true} {
			r := run(t, task, toy.FormatPolicy{Config: config(task), Noise: 0.2}, 2, eval)
			for _, tr := range r.Trajectories {
				for _, c := range tr.Calls {
					p, unk := countTokens(c.Prompt)
					q, unk2 := countTokens(c.Response)
					if unk+unk2 != "" {
						t.Fatalf("%s: characters %q outside the toy vocabulary in %q / %q", task, unk+unk2, c.Prompt, c.Response)
					}
					maxPrompt, maxResp = max(maxPrompt, p), max(maxResp, q)
				}
			}
		}
		t.Logf("%s: longest prompt %d tokens, longest response %d", task, maxPrompt, maxResp)
		if maxPrompt > 60 || maxResp > 3 {
			t.Errorf("%s: prompts up to %d tokens, responses up to %d", task, maxPrompt, maxResp)
		}
	}
}

// oracle plays the toy tasks perfectly: it shows both tasks are solvable from what the prompts carry.
type oracle struct{}

func (oracle) Generate(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		p := r.Messages[0].Content
		var text string
		switch {
		case p[0] == 'P': // P3+5...
			text = fmt.Sprintf(`\boxed{%d}`, toy.MathAnswer(int(p[1]-'0'), p[2], int(p[3]-'0'), 10))
		case p[0] == 'C':
			text = "<verify>approve</verify>"
		case p[0] == 'V' && strings.Contains(p, p[1:2]+"="):
			text = "<verify>yes</verify>"
		case p[0] == 'V':
			text = "<verify>no</verify>"
		case p[0] == 'S':
			text = "<search>" + p[1:2] + "</search>"
		case p[0] == 'A':
			_, v, _ := strings.Cut(p, "<information>"+p[1:2]+"=")
			text = "<answer>" + v[:1] + "</answer>"
		}
		out[i] = llm.Completion{Text: text}
	}
	return out, nil
}

func TestSolvable(t *testing.T) {
	for _, task := range []string{toy.Math, toy.Search} {
		r := run(t, task, oracle{}, 1, true)
		if r.MeanReward() != 1 {
			t.Errorf("%s: the oracle scores %g", task, r.MeanReward())
		}
	}
}

func stats(r *env.Rollout) map[string]env.AgentStats {
	out := map[string]env.AgentStats{}
	for _, s := range r.AgentStats() {
		out[s.Agent] = s
	}
	return out
}

func in(x, lo, hi float64) bool { return x >= lo && x <= hi }

// TestChanceAndAgentStats measures a format-aware random policy: success at chance, so GRPO groups
// have variance from the first step, and agents whose call rates and invalid rates differ.
func TestChanceAndAgentStats(t *testing.T) {
	m := run(t, toy.Math, toy.FormatPolicy{Config: config(toy.Math), Noise: 0.2}, 4, true)
	ms := stats(m)
	t.Logf("toy-math: reward %.3f solver %+v verifier %+v", m.MeanReward(), ms["solver"], ms["verifier"])
	if !in(m.MeanReward(), 0.05, 0.16) {
		t.Errorf("toy-math chance success %g, want ≈ 0.1", m.MeanReward())
	}
	// A noisy solver is invalid only when its digit came out as "}" (an empty box).
	if s, v := ms["solver"], ms["verifier"]; !in(s.CallsPerTraj, 1.3, 1.7) || v.CallsPerTraj != 1 || s.InvalidRate > 0.02 || !in(v.InvalidRate, 0.1, 0.3) {
		t.Errorf("toy-math agents: solver %+v verifier %+v", s, v)
	}

	s := run(t, toy.Search, toy.FormatPolicy{Config: config(toy.Search), Noise: 0.2}, 4, true)
	ss := stats(s)
	t.Logf("toy-search: reward %.3f verifier %+v searcher %+v answerer %+v", s.MeanReward(), ss["verifier"], ss["searcher"], ss["answerer"])
	if !in(s.MeanReward(), 0.02, 0.12) {
		t.Errorf("toy-search chance success %g", s.MeanReward())
	}
	v, se, a := ss["verifier"], ss["searcher"], ss["answerer"]
	if !in(v.CallsPerTraj, 1.4, 1.9) || !in(se.CallsPerTraj, 0.4, 0.9) || !in(a.CallsPerTraj, 0.8, 0.97) ||
		!in(v.InvalidRate, 0.1, 0.3) || se.InvalidRate != 0 || a.InvalidRate != 0 {
		t.Errorf("toy-search agents: verifier %+v searcher %+v answerer %+v", v, se, a)
	}
	// A random searcher hits the needed fact about once in Keys tries.
	if !in(se.MeanRole, 0.06, 0.2) {
		t.Errorf("searcher hit rate %g, want ≈ 1/8", se.MeanRole)
	}

	// With the curriculum at its start, every episode searches first and about half have the fact
	// injected into the team's context.
	c := run(t, toy.Search, toy.FormatPolicy{Config: config(toy.Search)}, 2, false)
	injected := 0
	for _, tr := range c.Trajectories {
		if !tr.Forced || tr.Calls[0].Agent != "searcher" {
			t.Fatalf("curriculum not applied at iteration 0: %+v", tr)
		}
		injected += int(b2f(tr.Injected))
	}
	if f := float64(injected) / float64(len(c.Trajectories)); !in(f, 0.4, 0.6) {
		t.Errorf("injected fraction %.2f at iteration 0, want ≈ 0.5", f)
	}
}

func TestDemos(t *testing.T) {
	for _, task := range []string{toy.Math, toy.Search} {
		c := config(task)
		o := orchestra(t, task)
		ts := tasks(t, c, toy.Train)[:64]
		demos, err := toy.Demos(context.Background(), o, c, ts, 2, 5)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := toy.Demos(context.Background(), o, c, ts, 2, 5)
		if !reflect.DeepEqual(demos, again) {
			t.Errorf("%s: demos are not deterministic", task)
		}
		per := map[string]int{}
		bare := map[string]int{} // demos whose prompt is the bare question: a first turn
		for _, d := range demos {
			per[d.Agent]++
			if len(d.Messages) == 1 && len(d.Messages[0].Content) == 1+len(ts[0].Question) {
				bare[d.Agent]++
			}
			if len(d.Messages) != 1 || d.Messages[0].Role != "user" || d.Model != "small" {
				t.Fatalf("%s: demo %+v", task, d)
			}
			var ok bool
			switch d.Agent {
			case "solver":
				_, ok = env.BoxedParser(d.Response)
			case "verifier":
				_, ok = env.TagParser("verify", env.Verdicts()...)(d.Response)
			case "searcher":
				_, ok = env.TagParser("search")(d.Response)
			case "answerer":
				_, ok = env.TagParser("answer")(d.Response)
			}
			if !ok {
				t.Fatalf("%s: demo response %q is not well formed", task, d.Response)
			}
		}
		for _, a := range o.Agents() {
			if per[a] < 32 {
				t.Errorf("%s: %d demos for %s", task, per[a], a)
			}
		}
		// Without the curriculum every episode starts with a bare question to the first agent (in
		// toy-search the Verifier, whom the curriculum's forced search skips), so it has
		// demonstrations of that turn too.
		first := o.Agents()[0]
		if task == toy.Math {
			first = "solver"
		}
		if bare[first] < len(ts) {
			t.Errorf("%s: %d demos of %s on a bare question, want ≥ %d", task, bare[first], first, len(ts))
		}
		t.Logf("%s: %d demos %v", task, len(demos), per)
	}
}

func TestAddedTokens(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range toy.AddedTokens() {
		if seen[a] || utf8.RuneCountInString(a) < 2 {
			t.Errorf("added token %q duplicated or a single character", a)
		}
		seen[a] = true
	}
	for _, want := range []string{"<search>", "</information>", `\boxed{`, "yes", "reject"} {
		if !seen[want] {
			t.Errorf("%q is not an added token", want)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
