package judge

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/answer"
	"github.com/drmas/drmas/pkg/metric"
)

// rollout is one task ("2+2", gold "4") answered in the given ways (answered when the answer is not
// "-"), each with a solver call and a verifier call.
func rollout(answers ...string) *env.Rollout {
	r := &env.Rollout{N: len(answers), Tasks: []env.Task{{ID: "t", Question: "2+2", Answers: []string{"4"}}}}
	for i, a := range answers {
		tr := env.Trajectory{UID: "0:t", TrajUID: "0:t#" + string(rune('0'+i)), TaskID: "t", Sample: i, Answer: a, Answered: a != "-",
			Calls: []env.Call{{Agent: "solver", Turn: 1, Response: `\boxed{` + a + `}`, Parsed: a, Valid: a != "-"},
				{Agent: "verifier", Turn: 1, Response: "<verify>approve</verify>", Parsed: "approve", Valid: true}}}
		if a == "-" {
			tr.Answer = ""
		}
		r.Trajectories = append(r.Trajectories, tr)
	}
	return r
}

// mathRule is the math orchestra's checker (env's rule for MatchMath).
func mathRule(roll *env.Rollout) env.RuleCheck {
	return func(tr *env.Trajectory) (bool, bool) {
		if !tr.Answered {
			return false, true
		}
		return answer.MathDecide(tr.Answer, roll.Tasks[tr.TaskIndex].Answers)
	}
}

func judgeReward(t *testing.T, url string, edit func(c *Config)) *Reward {
	t.Helper()
	c := Defaults()
	c.Type, c.Judge.URL, c.Judge.Prompt = TypeJudge, url, linePrompt
	if edit != nil {
		edit(&c)
	}
	r, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func rewards(outs []env.Outcome) []float64 {
	var out []float64
	for _, o := range outs {
		out = append(out, o.Reward)
	}
	return out
}

// Mode judge asks about every answered trajectory, fallback only about the answers the math checker
// cannot decide (not numbers); an unanswered trajectory scores 0 unasked in both.
func TestRewardModes(t *testing.T) {
	f := &fakeJudge{reply: func(p string) string {
		if strings.Contains(p, `answer: 2^2`) || strings.Contains(p, "answer: 4\n") {
			return "<verdict>correct</verdict>"
		}
		return "<verdict>incorrect</verdict>"
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	// 4 (rule: right), 5 (rule: wrong), 2^2 (undecided, the judge says right), x (undecided, wrong), none.
	roll := rollout("4", "5", "2^2", "x", "-")
	r := judgeReward(t, srv.URL, nil)
	outs, st, err := r.Outcomes(context.Background(), roll, mathRule(roll))
	if err != nil {
		t.Fatal(err)
	}
	if got := rewards(outs); !slices.Equal(got, []float64{1, 0, 1, 0, 0}) || !outs[2].Success || outs[1].Success {
		t.Errorf("mode judge: rewards %v (%+v)", got, outs)
	}
	if !maps.Equal(st, env.RewardStats{metric.JudgeCalls: 4, metric.JudgeCacheHits: 0, metric.JudgeFailures: 0, metric.JudgeJudged: 4}) || f.requests.Load() != 4 {
		t.Errorf("mode judge: %+v, %d requests", st, f.requests.Load())
	}
	fb := judgeReward(t, srv.URL, func(c *Config) { c.Judge.Mode = ModeFallback })
	outs, st, err = fb.Outcomes(context.Background(), roll, mathRule(roll))
	if err != nil {
		t.Fatal(err)
	}
	if got := rewards(outs); !slices.Equal(got, []float64{1, 0, 1, 0, 0}) {
		t.Errorf("mode fallback: rewards %v", got)
	}
	if !maps.Equal(st, env.RewardStats{metric.JudgeCalls: 2, metric.JudgeCacheHits: 0, metric.JudgeFailures: 0, metric.JudgeJudged: 2}) || f.requests.Load() != 6 {
		t.Errorf("mode fallback: %+v, %d requests in all (want 2 more)", st, f.requests.Load())
	}
	// A judge that scores the rule's decisions differently shows which ones it was asked.
	f.reply = func(string) string { return "<verdict>correct</verdict>" }
	fb2 := judgeReward(t, srv.URL, func(c *Config) { c.Judge.Mode = ModeFallback })
	outs, _, _ = fb2.Outcomes(context.Background(), roll, mathRule(roll))
	if got := rewards(outs); !slices.Equal(got, []float64{1, 0, 1, 1, 0}) {
		t.Errorf("mode fallback, a lenient judge: rewards %v (only 2^2 and x are its)", got)
	}
}

// on_error fail: a failed judgement fails the rollout with the named error; on_error score: it scores
// error_score and is counted, never a silent 0.
func TestRewardOnError(t *testing.T) {
	f := &fakeJudge{reply: func(p string) string {
		if strings.Contains(p, "answer: 5") {
			return "hmm"
		}
		return "<verdict>correct</verdict>"
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	roll := rollout("4", "5", "5", "6")
	_, _, err := judgeReward(t, srv.URL, nil).Outcomes(context.Background(), roll, mathRule(roll))
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindUnparseable || !strings.Contains(err.Error(), "2 of 4 judgements failed (reward.judge.on_error: fail)") ||
		!strings.Contains(err.Error(), `"hmm"`) {
		t.Errorf("on_error fail: %v", err)
	}
	r := judgeReward(t, srv.URL, func(c *Config) { c.Judge.OnError, c.Judge.ErrorScore = OnErrorScore, 0.25 })
	outs, st, err := r.Outcomes(context.Background(), roll, mathRule(roll))
	if err != nil {
		t.Fatal(err)
	}
	if got := rewards(outs); !slices.Equal(got, []float64{1, 0.25, 0.25, 1}) {
		t.Errorf("on_error score: rewards %v", got)
	}
	// "5" twice: one call, one cache hit (an unparseable reply is a reply: kept), both failures.
	if !maps.Equal(st, env.RewardStats{metric.JudgeCalls: 3, metric.JudgeCacheHits: 1, metric.JudgeFailures: 2, metric.JudgeJudged: 2}) {
		t.Errorf("on_error score: %+v", st)
	}
}

// remoteServer scores each trajectory by its number of valid calls and its answer, per call by
// position, in batches it records.
type remoteServer struct {
	batches []int
	posts   atomic.Int64
	fail    func(n int64) bool
	short   bool // reply with one score too few
}

func (s *remoteServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := s.posts.Add(1)
	if s.fail != nil && s.fail(n) {
		http.Error(w, "down", http.StatusBadGateway)
		return
	}
	var req remoteRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.batches = append(s.batches, len(req.Trajectories))
	type sc struct {
		Score float64   `json:"score"`
		Calls []float64 `json:"calls,omitempty"`
	}
	var out struct {
		Scores []sc `json:"scores"`
	}
	for _, tr := range req.Trajectories {
		v := 0.0
		for _, c := range tr.Calls {
			if c.Valid {
				v += 0.5
			}
		}
		if tr.Answer == tr.References[0] && tr.Question == "2+2" && tr.Reference == "4" {
			v += 1
		}
		x := sc{Score: v}
		if tr.Answer == "5" {
			x.Calls = []float64{0.3, float64(tr.Sample)}
		}
		out.Scores = append(out.Scores, x)
	}
	if s.short {
		out.Scores = out.Scores[1:]
	}
	json.NewEncoder(w).Encode(out)
}

func remoteReward(t *testing.T, url string, edit func(c *Config)) *Reward {
	t.Helper()
	c := Defaults()
	c.Type, c.Remote.URL, c.Remote.BatchSize, c.SuccessThreshold = TypeRemote, url, 2, 2
	if edit != nil {
		edit(&c)
	}
	r, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The remote endpoint scores whole trajectories, batch_size per POST, with optional per-call scores;
// a reply that does not fit the request is a named malformed failure.
func TestRemote(t *testing.T) {
	s := &remoteServer{}
	srv := httptest.NewServer(s)
	defer srv.Close()
	roll := rollout("4", "5", "-", "4", "5")
	outs, st, err := remoteReward(t, srv.URL, nil).Outcomes(context.Background(), roll, mathRule(roll))
	if err != nil {
		t.Fatal(err)
	}
	if got := rewards(outs); !slices.Equal(got, []float64{2, 1, 0.5, 2, 1}) {
		t.Errorf("rewards %v", got)
	}
	if !outs[0].Success || outs[1].Success || outs[0].CallScores != nil || !slices.Equal(outs[4].CallScores, []float64{0.3, 4}) {
		t.Errorf("outcomes %+v", outs)
	}
	slices.Sort(s.batches)
	if !maps.Equal(st, env.RewardStats{metric.RemoteCalls: 3, metric.RemoteFailures: 0}) || !slices.Equal(s.batches, []int{1, 2, 2}) {
		t.Errorf("stats %+v, batches %v", st, s.batches)
	}
	s.short = true
	_, _, err = remoteReward(t, srv.URL, nil).Outcomes(context.Background(), roll, mathRule(roll))
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindMalformed || !strings.Contains(err.Error(), "remote reward "+srv.URL+": malformed: 1 scores for 2 trajectories") {
		t.Errorf("a short reply: %v", err)
	}
}

// A POST that keeps failing fails the rollout (on_error fail, naming the endpoint and the status) or
// scores its trajectories error_score, counted (on_error score); a failure that recovers within the
// retries changes nothing.
func TestRemoteFailures(t *testing.T) {
	s := &remoteServer{fail: func(n int64) bool { return n == 1 }}
	srv := httptest.NewServer(s)
	defer srv.Close()
	roll := rollout("4", "5")
	outs, _, err := remoteReward(t, srv.URL, nil).Outcomes(context.Background(), roll, mathRule(roll))
	if err != nil || !slices.Equal(rewards(outs), []float64{2, 1}) {
		t.Fatalf("a retried 502: %v %v", rewards(outs), err)
	}
	s.fail = func(int64) bool { return true }
	_, _, err = remoteReward(t, srv.URL, nil).Outcomes(context.Background(), roll, mathRule(roll))
	if err == nil || !strings.Contains(err.Error(), "2 of 2 trajectories unscored (reward.remote.on_error: fail): remote reward "+srv.URL+": HTTP 502 Bad Gateway") ||
		!strings.Contains(err.Error(), "(3 tries)") {
		t.Errorf("on_error fail: %v", err)
	}
	outs, st, err := remoteReward(t, srv.URL, func(c *Config) {
		c.Remote.OnError, c.Remote.ErrorScore, c.Remote.Retries = OnErrorScore, -1, 0
	}).Outcomes(context.Background(), roll, mathRule(roll))
	if err != nil || !slices.Equal(rewards(outs), []float64{-1, -1}) || st[metric.RemoteFailures] != 2 || st[metric.RemoteCalls] != 1 {
		t.Errorf("on_error score: %v %+v %v", rewards(outs), st, err)
	}
}

// Every problem of the section names its key.
func TestConfigValidate(t *testing.T) {
	c := Defaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if r, err := New(c); r != nil || err != nil {
		t.Errorf("type rule: %v %v, want no reward", r, err)
	}
	c.Type = TypeJudge
	c.Judge.URL, c.Judge.Mode, c.Judge.Prompt, c.Judge.Pattern = "ftp://x", "sometimes", "{{.Nope}}", "no group"
	c.Judge.Verdicts = map[string]float64{"right": 2}
	c.Judge.APIKeyEnv, c.Judge.MaxConcurrency, c.Judge.Timeout, c.Judge.OnError = "sk-123 abc", 0, 0, "ignore"
	err := c.Validate()
	for _, key := range []string{"reward.judge.url", "reward.judge.mode", "reward.judge.prompt", "reward.judge.pattern",
		"reward.judge.verdicts.right", "reward.judge.api_key_env", "reward.judge.max_concurrency", "reward.judge.timeout", "reward.judge.on_error"} {
		if err == nil || !strings.Contains(err.Error(), key+": ") {
			t.Errorf("no problem named %s in %v", key, err)
		}
	}
	c = Defaults()
	c.Type, c.Remote.BatchSize = TypeRemote, 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "reward.remote.url: required") || !strings.Contains(err.Error(), "reward.remote.batch_size") {
		t.Errorf("remote: %v", err)
	}
	c.Type = "llm"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "reward.type: must be one of rule, judge, remote") {
		t.Errorf("type: %v", err)
	}
}
