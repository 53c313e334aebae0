package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/judge"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/train"
)

// judgeTeam is configs/toy-math-judge.yaml shrunk like toyTeam, its rollouts dumped every iteration.
func judgeTeam(t *testing.T, dir string, sets ...string) *config.Config {
	t.Helper()
	base := append(toyTeamSets(dir, "float32"), "run.dump_every=1", "warmup.steps=120", "warmup.lr=1.0e-2")
	cfg, err := config.Load("../../configs/toy-math-judge.yaml", append(base, sets...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Models {
		cfg.Models[i].Tokenizer = "../../" + cfg.Models[i].Tokenizer
	}
	return cfg
}

// dumpedTrajectory is one trajectory read back from rollouts/step-N.jsonl.
type dumpedTrajectory struct {
	id, question, answer string
	reward               float64
	gold                 []string
	calls                []env.TranscriptLine
}

// dumped reads an iteration's rollout dump, trajectories in order.
func dumped(t *testing.T, dir string, step int) []*dumpedTrajectory {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "rollouts", fmt.Sprintf("step-%d.jsonl", step)))
	if err != nil {
		t.Fatal(err)
	}
	var out []*dumpedTrajectory
	byID := map[string]*dumpedTrajectory{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var l env.TranscriptLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		d := byID[l.TrajUID]
		if d == nil {
			// The toy solver's first prompt is "P" + the question (pkg/env/prompts.go).
			d = &dumpedTrajectory{id: l.TrajUID, question: strings.TrimPrefix(l.Prompt, "P"), answer: l.Answer, reward: l.Reward, gold: l.GroundTruth}
			byID[l.TrajUID] = d
			out = append(out, d)
		}
		d.calls = append(d.calls, l)
	}
	return out
}

// A training whose reward is an LLM judge served by `drmas serve` runs 3 iterations, and every
// trajectory's reward is the judge's parsed verdict on its answer: a test proxy in front of the
// server records each prompt and reply, and the test reads the verdicts itself (the last of the
// config's words; 0, the config's error_score, for a reply without one). Each distinct input is asked
// once (the cache), the key named by api_key_env reaches the server, and metrics count the calls,
// cache hits and failures.
func TestJudgeRewardTrains(t *testing.T) {
	dir := t.TempDir()
	cfg := judgeTeam(t, dir)
	const key = "judge-test-key"
	t.Setenv("DRMAS_TEST_JUDGE_KEY", key)
	s := startServe(t, initialFolder(t, cfg), "--api-key", key)

	var mu sync.Mutex
	replies := map[string]string{} // prompt → reply
	asked := map[string]int{}
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequest(http.MethodPost, s.URL+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		var in struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		var rep struct {
			Choices []struct{ Message struct{ Content string } } `json:"choices"`
		}
		if json.Unmarshal(body, &in) == nil && json.Unmarshal(out, &rep) == nil && len(in.Messages) == 1 && len(rep.Choices) == 1 {
			mu.Lock()
			replies[in.Messages[0].Content] = rep.Choices[0].Message.Content
			asked[in.Messages[0].Content]++
			mu.Unlock()
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(out)
	}))
	defer p.Close()
	cfg.Reward.Judge.URL = p.URL
	cfg.Reward.Judge.APIKeyEnv = "DRMAS_TEST_JUDGE_KEY"
	cfg.Reward.Judge.Temperature = 1 // the untrained toy judge says something different to each input
	cfg.Reward.Judge.MaxTokens = 64
	if err := runTraining(t, cfg, false); err != nil {
		t.Fatal(err)
	}

	words := regexp.MustCompile(`(approve|reject|yes|no)`)
	verdict := func(reply string) (float64, bool) {
		if i := strings.LastIndex(reply, "</think>"); i >= 0 { // docs/rewards.md: what follows the last </think>
			reply = reply[i+len("</think>"):]
		}
		m := words.FindAllString(reply, -1)
		if len(m) == 0 {
			return 0, false
		}
		return map[string]float64{"approve": 1, "yes": 1, "reject": 0, "no": 0}[m[len(m)-1]], true
	}
	calls, hits, fails := column(t, dir, metric.JudgeCalls), column(t, dir, metric.JudgeCacheHits), column(t, dir, metric.JudgeFailures)
	judged, means := column(t, dir, metric.JudgeJudged), column(t, dir, metric.RewardMean)
	if len(calls) != 3 || len(hits) != 3 || len(fails) != 3 || len(judged) != 3 || len(means) != 3 {
		t.Fatalf("3 iterations want 3 values of each judge metric: calls %v, hits %v, failures %v, judged %v, reward %v", calls, hits, fails, judged, means)
	}
	parsed, answered := 0, 0
	for step := 1; step <= 3; step++ {
		trajs := dumped(t, dir, step)
		var sum float64
		wantFails, wantJudged := 0, 0
		for _, d := range trajs {
			prompt := "C" + d.question + "=" + strings.Join(d.gold, " | ") + "?" + d.answer
			mu.Lock()
			reply, ok := replies[prompt]
			mu.Unlock()
			want := 0.0
			switch {
			case ok:
				answered++
				if v, found := verdict(reply); found {
					want, parsed = v, parsed+1
					wantJudged++
				} else {
					wantFails++ // error_score 0
				}
			case d.answer != "":
				t.Errorf("step %d %s: answer %q was never put to the judge (prompt %q)", step, d.id, d.answer, prompt)
			}
			if d.reward != want {
				t.Errorf("step %d %s: reward %g, the judge's verdict on %q is %g (reply %q)", step, d.id, d.reward, d.answer, want, reply)
			}
			for _, c := range d.calls {
				if c.Reward != d.reward {
					t.Errorf("step %d %s: a call's reward %g, the trajectory's %g", step, d.id, c.Reward, d.reward)
				}
			}
			sum += d.reward
		}
		if m := sum / float64(len(trajs)); math.Abs(m-means[step-1]) > 1e-12 {
			t.Errorf("step %d: reward/mean %g, the trajectories' mean %g", step, means[step-1], m)
		}
		if int(fails[step-1]) != wantFails || int(judged[step-1]) != wantJudged {
			t.Errorf("step %d: failures %g judged %g, want %d and %d", step, fails[step-1], judged[step-1], wantFails, wantJudged)
		}
		if int(calls[step-1]+hits[step-1]) != wantFails+wantJudged {
			t.Errorf("step %d: %g calls + %g cache hits, want one per judged trajectory (%d)", step, calls[step-1], hits[step-1], wantFails+wantJudged)
		}
	}
	for prompt, n := range asked {
		if n != 1 {
			t.Errorf("the judge was asked %q %d times: each distinct input once (the cache)", prompt, n)
		}
	}
	if answered == 0 || parsed == 0 {
		t.Fatalf("%d judged trajectories, %d with a verdict: nothing to compare", answered, parsed)
	}
	t.Logf("%d judged trajectories, %d with a verdict; %d distinct inputs; calls %v hits %v failures %v", answered, parsed, len(asked), calls, hits, fails)
}

// remoteScore is the test endpoint's reward, a function of the whole trajectory: a quarter per valid
// call plus 1 for an answer equal to the first reference; per call, its position and validity.
func remoteScore(tr judge.Trajectory) (float64, []float64) {
	s := 0.0
	calls := make([]float64, len(tr.Calls))
	for i, c := range tr.Calls {
		if c.Valid {
			s += 0.25
		}
		calls[i] = float64(i+1)/10 + float64(len(c.Text)%3)/100
	}
	if len(tr.References) > 0 && tr.Answered && tr.Answer == tr.References[0] {
		s++
	}
	return s, calls
}

// trajKey tells trajectories apart across iterations (a uid recurs when a task is drawn again at
// the same place of a batch): the uid and the calls' texts.
func trajKey(id string, calls []judge.Call) string {
	k := id
	for _, c := range calls {
		k += "\x00" + c.Text
	}
	return k
}

// A training whose reward is a remote endpoint (an httptest server speaking docs/contracts.md's JSON)
// runs 3 iterations: every trajectory's reward and every call's score are the endpoint's (the call
// score less the invalid-action penalty), the POSTs are batch_size trajectories each, and `drmas
// eval`'s path (env.Evaluate over the team's orchestra) gets the same reward.
func TestRemoteRewardTrains(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]judge.Trajectory{}
	posts, bad := 0, []string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Trajectories []judge.Trajectory `json:"trajectories"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		type score struct {
			Score float64   `json:"score"`
			Calls []float64 `json:"calls"`
		}
		var out struct {
			Scores []score `json:"scores"`
		}
		mu.Lock()
		posts++
		for _, tr := range req.Trajectories {
			if tr.Question == "" || len(tr.References) == 0 || tr.ID == "" || len(tr.Calls) == 0 || tr.Calls[0].Agent != "solver" {
				bad = append(bad, fmt.Sprintf("%+v", tr))
			}
			seen[trajKey(tr.ID, tr.Calls)] = tr
			s, c := remoteScore(tr)
			out.Scores = append(out.Scores, score{s, c})
		}
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer srv.Close()

	dir := t.TempDir()
	cfg := judgeTeam(t, dir, "reward={type: remote, remote: {url: '"+srv.URL+"', batch_size: 5, max_concurrency: 2}}")
	if err := runTraining(t, cfg, false); err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("the endpoint got malformed trajectories: %v", bad[0])
	}
	check := func(where string, lines []env.TranscriptLine) {
		t.Helper()
		byID := map[string][]env.TranscriptLine{}
		var order []string
		for _, l := range lines {
			if byID[l.TrajUID] == nil {
				order = append(order, l.TrajUID)
			}
			byID[l.TrajUID] = append(byID[l.TrajUID], l)
		}
		for _, id := range order {
			ls := byID[id]
			var texts []judge.Call
			for _, l := range ls {
				texts = append(texts, judge.Call{Text: l.Response})
			}
			mu.Lock()
			tr, ok := seen[trajKey(id, texts)]
			mu.Unlock()
			if !ok || len(tr.Calls) != len(ls) {
				t.Fatalf("%s %s: the endpoint never saw it with its %d calls (%+v)", where, id, len(ls), tr)
			}
			want, calls := remoteScore(tr)
			for i, l := range ls {
				if l.Reward != want {
					t.Errorf("%s %s: reward %g, the endpoint's %g", where, id, l.Reward, want)
				}
				ws := calls[i]
				if !l.Valid {
					ws -= 0.1 // the math orchestra's invalid-action penalty
				}
				if math.Abs(l.Score-ws) > 1e-12 || l.Response != tr.Calls[i].Text || l.Agent != tr.Calls[i].Agent {
					t.Errorf("%s %s call %d: score %g (%s %q), the endpoint's %g (%s %q)", where, id, i, l.Score, l.Agent, l.Response, ws, tr.Calls[i].Agent, tr.Calls[i].Text)
				}
			}
		}
	}
	nonzero := 0
	for _, tr := range seen {
		if s, _ := remoteScore(tr); s != 0 {
			nonzero++
		}
	}
	if nonzero == 0 {
		t.Fatal("the endpoint scored every trajectory 0: nothing to compare")
	}
	means, rcalls := column(t, dir, metric.RewardMean), column(t, dir, metric.RemoteCalls)
	if len(means) != 3 || len(rcalls) != 3 {
		t.Fatalf("reward/mean %v, reward/remote/calls %v: want 3 iterations", means, rcalls)
	}
	for step := 1; step <= 3; step++ {
		trajs := dumped(t, dir, step)
		var lines []env.TranscriptLine
		var sum float64
		for _, d := range trajs {
			lines = append(lines, d.calls...)
			sum += d.reward
		}
		check(fmt.Sprintf("step %d", step), lines)
		if m := sum / float64(len(trajs)); math.Abs(m-means[step-1]) > 1e-12 {
			t.Errorf("step %d: reward/mean %g, the endpoint's mean %g", step, means[step-1], m)
		}
		if want := (len(trajs) + 4) / 5; int(rcalls[step-1]) != want {
			t.Errorf("step %d: %g POSTs for %d trajectories in batches of 5, want %d", step, rcalls[step-1], len(trajs), want)
		}
	}

	// drmas eval's path: the team's orchestra carries the same reward.
	team, err := train.LoadTeam(cfg, "cpu", filepath.Join(dir, "step-3"))
	if err != nil {
		t.Fatal(err)
	}
	defer team.Close()
	var buf bytes.Buffer
	rep, err := team.Evaluate(context.Background(), team.Val, train.EvalOptions{EvalOptions: env.EvalOptions{K: 2, Seed: 5, Transcripts: &buf}})
	if err != nil {
		t.Fatal(err)
	}
	var lines []env.TranscriptLine
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var tl env.TranscriptLine
		if err := json.Unmarshal(l, &tl); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, tl)
	}
	check("eval", lines)
	t.Logf("%d trajectories scored; eval mean reward %g over %d questions", len(seen), rep.Datasets[0].MeanReward, rep.Datasets[0].Questions)
}

// configs/toy-math-judge.yaml passes --dry-run with its judge not running yet (a warning), and a key
// variable that is not set is an error naming it.
func TestJudgeConfigDryRun(t *testing.T) {
	args := []string{"train", "--config", "../../configs/toy-math-judge.yaml", "--dry-run", "--set", "models.0.tokenizer=../../configs/toy/tokenizer.json"}
	out, _, err := execDrmas(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"type: judge", "url: http://127.0.0.1:30000", "on_error: score"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
	_, _, err = execDrmas(t, append(args, "--set", "reward.judge.api_key_env=DRMAS_TEST_UNSET_JUDGE_KEY")...)
	if err == nil || !strings.Contains(err.Error(), "DRMAS_TEST_UNSET_JUDGE_KEY") {
		t.Errorf("an unset key variable: %v", err)
	}
}
