package env

import (
	"context"
	"strconv"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// cheapGen is a scripted policy with no per-request allocation beyond the completions, so the
// benchmarks measure the orchestra, not the fake.
type cheapGen struct{}

var cheapText = map[string][2]string{
	"verifier": {"<verify>no</verify>", "<verify>yes</verify>"},
	"searcher": {"<search>k</search>", "<search>m</search>"},
	"answerer": {"<answer>7</answer>", "<answer>3</answer>"},
	"solver":   {`\boxed{4}`, `\boxed{3}`},
}

func (cheapGen) Generate(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		t := cheapText[r.Agent][r.Sampling.Seed&1]
		if r.Agent == "verifier" && r.Sampling.Seed&2 != 0 && len(r.Messages[0].Content) < 30 {
			t = "<verify>reject</verify>"
		}
		out[i] = llm.Completion{Text: t, Finish: llm.FinishStop}
	}
	return out, nil
}

// benchRun runs one rollout of 32 tasks × 8 samples = 256 episodes per iteration and reports the
// overhead per episode and per agent call (the policy excluded).
func benchRun(b *testing.B, o Orchestra, tasks []Task) {
	ctx := context.Background()
	calls := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := o.Run(ctx, cheapGen{}, tasks, 8, RunOptions{Seed: 1, Iteration: i})
		if err != nil {
			b.Fatal(err)
		}
		calls += len(r.Samples())
	}
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns/256, "ns/episode")
	b.ReportMetric(ns*float64(b.N)/float64(calls), "ns/call")
}

func BenchmarkSearch256(b *testing.B) {
	cfg := toyConfig("search")
	cfg.Curriculum.Inject = Ramp{P0: 0.5, Hold: 1 << 30}
	o := mustOrchestra(b, cfg, agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{})
	tasks := searchTasks(make([]string, 32)...)
	for i := range tasks {
		tasks[i].ID, tasks[i].Question = strconv.Itoa(i), "k?"
	}
	benchRun(b, o, tasks)
}

func BenchmarkSearchPaper256(b *testing.B) {
	cfg := DefaultOrchestraConfig()
	cfg.Type = "search"
	o := mustOrchestra(b, cfg, agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{})
	tasks := searchTasks(make([]string, 32)...)
	for i := range tasks {
		tasks[i].ID, tasks[i].Question = strconv.Itoa(i), "Which value does key k hold in this corpus?"
	}
	benchRun(b, o, tasks)
}

func BenchmarkMath256(b *testing.B) {
	o := mustOrchestra(b, toyConfig("math"), agentsNamed("m", "solver", "verifier"), nil)
	tasks := tasksOf(make([]string, 32)...)
	for i := range tasks {
		tasks[i].ID, tasks[i].Question = strconv.Itoa(i), "3+1"
	}
	benchRun(b, o, tasks)
}
