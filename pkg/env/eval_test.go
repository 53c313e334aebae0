package env

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// randomRule plays the search team at random from each request's seed: the verifier says yes or no,
// the searcher asks for a random key (or forgets the tags), the answerer answers a digit.
func randomRule(r llm.Request) string {
	rng := rand.New(rand.NewPCG(uint64(r.Sampling.Seed), 3))
	switch r.Agent {
	case "verifier":
		return []string{"<verify>yes</verify>", "<verify>no</verify>", "hmm"}[rng.IntN(3)]
	case "searcher":
		return []string{"<search>k</search>", "<search>m</search>", "k"}[rng.IntN(3)]
	}
	return fmt.Sprintf("<answer>%d</answer>", rng.IntN(3))
}

func randomSearchTasks(prefix string, n int, seed uint64) []Task {
	rng := rand.New(rand.NewPCG(seed, 0))
	out := make([]Task, n)
	for i := range out {
		k, m := rng.IntN(3), rng.IntN(3)
		out[i] = Task{ID: fmt.Sprintf("%s%d", prefix, i), Question: "k?", Answers: []string{fmt.Sprint(k)},
			Facts: []string{fmt.Sprintf("k=%d", k), fmt.Sprintf("m=%d", m)}, Support: []string{fmt.Sprintf("k=%d", k)}}
	}
	return out
}

func TestEvaluateFromTranscripts(t *testing.T) {
	o := mustOrchestra(t, toyConfig("search"), agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{})
	sets := []EvalSet{{Name: "alpha", Tasks: randomSearchTasks("a", 7, 1)}, {Name: "beta", Tasks: randomSearchTasks("b", 5, 2)}}
	const k = 4
	var buf bytes.Buffer
	rep, err := Evaluate(context.Background(), o, &script{rule: randomRule}, sets, EvalOptions{K: k, Seed: 11, BatchSize: 3, Transcripts: &buf})
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ ds, q string }
	success := map[key]map[int]bool{}
	lines := 0
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l TranscriptLine
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("line %d: %v", lines+1, err)
		}
		lines++
		if l.Sample < 0 || l.Sample >= k || l.Turn < 1 || l.Agent == "" || l.Prompt == "" || l.TrajUID == "" || l.UID == "" {
			t.Fatalf("bad line %+v", l)
		}
		// Grading can be audited from the line alone: the gold answers and the extracted answer.
		var task Task
		for _, set := range sets {
			for _, tk := range set.Tasks {
				if set.Name == l.Dataset && tk.ID == l.QuestionID {
					task = tk
				}
			}
		}
		if len(l.GroundTruth) == 0 || l.GroundTruth[0] != task.Answers[0] {
			t.Fatalf("line %d: ground_truth %v, want %v", lines, l.GroundTruth, task.Answers)
		}
		if l.Success && l.Answer != task.Answers[0] {
			t.Fatalf("line %d: a success whose extracted answer %q is not the gold %q", lines, l.Answer, task.Answers[0])
		}
		kk := key{l.Dataset, l.QuestionID}
		if success[kk] == nil {
			success[kk] = map[int]bool{}
		}
		if prev, seen := success[kk][l.Sample]; seen && prev != l.Success {
			t.Fatalf("calls of one trajectory disagree on success: %+v", l)
		}
		success[kk][l.Sample] = l.Success
	}
	calls := 0
	for _, a := range rep.Agents {
		calls += a.Calls
	}
	if lines != calls {
		t.Errorf("%d transcript lines, %d calls in the report", lines, calls)
	}
	var mean [2]float64
	for i, set := range sets {
		var avg, pass float64
		for _, task := range set.Tasks {
			s := success[key{set.Name, task.ID}]
			if len(s) != k {
				t.Fatalf("%s/%s: %d samples in the transcript, want %d", set.Name, task.ID, len(s), k)
			}
			wins := 0
			for _, ok := range s {
				wins += int(b2f(ok))
			}
			avg += float64(wins) / k
			pass += b2f(wins > 0)
		}
		avg /= float64(len(set.Tasks))
		pass /= float64(len(set.Tasks))
		d := rep.Datasets[i]
		if d.Name != set.Name || d.Questions != len(set.Tasks) || !approx(d.AvgAtK, avg) || !approx(d.PassAtK, pass) {
			t.Errorf("%s: report avg@%d %g pass@%d %g, transcripts give %g %g", set.Name, k, d.AvgAtK, k, d.PassAtK, avg, pass)
		}
		if avg == 0 || avg == 1 || pass < avg {
			t.Errorf("%s: degenerate figures avg %g pass %g", set.Name, avg, pass)
		}
		mean[0] += avg / 2
		mean[1] += pass / 2
	}
	if !approx(rep.AvgAtK, mean[0]) || !approx(rep.PassAtK, mean[1]) {
		t.Errorf("overall %g %g, want %g %g", rep.AvgAtK, rep.PassAtK, mean[0], mean[1])
	}
	m := rep.Metrics("val")
	if m["val/alpha/avg@4"] != rep.Datasets[0].AvgAtK || m["val/pass@4"] != rep.PassAtK || m["val/calls/agent/verifier"] == 0 {
		t.Errorf("metrics %v", m)
	}
	var inv float64
	for _, a := range rep.Agents {
		inv += a.InvalidRate
	}
	if inv == 0 {
		t.Error("the random team never erred: the invalid rates are not being counted")
	}

	// Batching does not change what is sampled.
	var again bytes.Buffer
	rep2, err := Evaluate(context.Background(), o, &script{rule: randomRule}, sets, EvalOptions{K: k, Seed: 11, BatchSize: 100, Transcripts: &again})
	if err != nil {
		t.Fatal(err)
	}
	if rep2.AvgAtK != rep.AvgAtK || rep2.PassAtK != rep.PassAtK || !bytes.Equal(again.Bytes(), buf.Bytes()) {
		t.Error("another batch size changed the evaluation")
	}
}

func TestEvaluateErrors(t *testing.T) {
	o := mustOrchestra(t, toyConfig("search"), agentsNamed("m", "verifier", "searcher", "answerer"), FactRetriever{})
	_, err := Evaluate(context.Background(), o, &script{rule: randomRule}, []EvalSet{{Name: "empty"}}, EvalOptions{})
	if err == nil || !strings.Contains(err.Error(), `dataset "empty" has no questions`) {
		t.Errorf("err = %v", err)
	}
	failing := &script{rule: func(llm.Request) string { return "" }}
	_, err = Evaluate(context.Background(), o, badGen{failing}, []EvalSet{{Name: "x", Tasks: randomSearchTasks("x", 1, 1)}}, EvalOptions{})
	if err == nil || !strings.Contains(err.Error(), "eval x: generate verifier: 0 completions for 1 requests") {
		t.Errorf("err = %v", err)
	}
}

// badGen returns too few completions.
type badGen struct{ *script }

func (b badGen) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out, err := b.script.Generate(ctx, reqs)
	return out[:0], err
}

func TestEvalReportTable(t *testing.T) {
	r := &EvalReport{K: 4, AvgAtK: 0.25, PassAtK: 0.5,
		Datasets: []DatasetReport{{Name: "toy", Questions: 8, AvgAtK: 0.25, PassAtK: 0.5, MeanReward: 0.25,
			Agents: []AgentStats{{Agent: "solver", CallsPerTraj: 1.5, InvalidRate: 0.125, MeanRespToken: 3}}}}}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"avg@4", "pass@4", "0.2500", "0.5000", "average", "solver", "1.500", "0.125", "3.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
