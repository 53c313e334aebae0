package judge

import (
	"context"
	"math"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
)

// solverScript answers each toy math prompt ("P<question>…") with the boxed text of answers[question]
// and has the verifier approve.
type solverScript map[string]string

func (s solverScript) Generate(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		text := "<verify>approve</verify>"
		if r.Agent == "solver" {
			text = `\boxed{` + s[strings.TrimPrefix(r.Messages[0].Content, "P")] + `}`
		}
		out[i] = llm.Completion{Text: text, ResponseIDs: []int{1}, Finish: llm.FinishStop}
	}
	return out, nil
}

// Through env.Evaluate (training's validation and drmas eval) a math team's avg@k and mean reward are
// the judge's: a lenient judge accepts "2^2" for 4, which the math checker cannot decide; in fallback
// mode the checker's decisions stand.
func TestJudgedEvaluation(t *testing.T) {
	f := &fakeJudge{reply: func(p string) string {
		if strings.Contains(p, "answer: 2^2\n") || strings.Contains(p, "answer: 4\n") || strings.Contains(p, "answer: 5\n") {
			return "<verdict>correct</verdict>" // a judge that also (wrongly) accepts 5
		}
		return "<verdict>incorrect</verdict>"
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	oc := env.DefaultOrchestraConfig()
	oc.Type, oc.Prompts = "math", env.PromptsToy
	inner, err := env.NewOrchestra(oc, []env.AgentConfig{{Name: "solver", Model: "m"}, {Name: "verifier", Model: "m"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tasks := []env.Task{{ID: "a", Question: "2+2", Answers: []string{"4"}}, {ID: "b", Question: "1+3", Answers: []string{"4"}},
		{ID: "c", Question: "3+3", Answers: []string{"4"}}, {ID: "d", Question: "0+4", Answers: []string{"4"}}}
	gen := solverScript{"2+2": "4", "1+3": "2^2", "3+3": "5", "0+4": "x"}
	sets := []env.EvalSet{{Name: "s", Tasks: tasks}}
	for _, c := range []struct {
		mode string
		want float64 // avg@k = mean reward: judged right / 4
	}{{ModeJudge, 3.0 / 4}, {ModeFallback, 2.0 / 4}} { // fallback: 5 is a number, the checker says wrong
		cfg := Defaults()
		cfg.Type, cfg.Judge.URL, cfg.Judge.Prompt, cfg.Judge.Mode = TypeJudge, srv.URL, linePrompt, c.mode
		o, err := Wrap(inner, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := env.Evaluate(context.Background(), o, gen, sets, env.EvalOptions{K: 2})
		if err != nil {
			t.Fatal(err)
		}
		if d := rep.Datasets[0]; math.Abs(d.AvgAtK-c.want) > 1e-12 || math.Abs(d.MeanReward-c.want) > 1e-12 {
			t.Errorf("mode %s: avg@2 %g, mean reward %g; want %g", c.mode, d.AvgAtK, d.MeanReward, c.want)
		}
	}
	rule, err := Wrap(inner, Defaults())
	if err != nil || rule != inner {
		t.Errorf("type rule: %v %v, want the orchestra itself", rule, err)
	}
}
