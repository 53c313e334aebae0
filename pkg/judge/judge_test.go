package judge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestMain(m *testing.M) {
	zerolog.SetGlobalLevel(zerolog.ErrorLevel)
	backoff = 5 * time.Millisecond
	os.Exit(m.Run())
}

// fakeJudge is an OpenAI chat endpoint whose reply is reply(prompt); it counts requests, keeps the
// prompts and the largest number of requests in flight at once.
type fakeJudge struct {
	reply    func(prompt string) string
	delay    time.Duration
	status   func(n int64) int // the status of the n-th request (1-based); nil: 200
	requests atomic.Int64
	inFlight atomic.Int64
	maxSeen  atomic.Int64
	mu       sync.Mutex
	prompts  []string
	auth     []string
	seeds    map[string]int64
}

func (f *fakeJudge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.requests.Add(1)
	cur := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for m := f.maxSeen.Load(); cur > m && !f.maxSeen.CompareAndSwap(m, cur); m = f.maxSeen.Load() {
	}
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	prompt := req.Messages[len(req.Messages)-1].Content
	f.mu.Lock()
	f.prompts = append(f.prompts, prompt)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	if f.seeds == nil {
		f.seeds = map[string]int64{}
	}
	if req.Seed != nil {
		f.seeds[prompt] = *req.Seed
	}
	f.mu.Unlock()
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-r.Context().Done():
			return
		}
	}
	if f.status != nil {
		if s := f.status(n); s != http.StatusOK {
			http.Error(w, fmt.Sprintf(`{"error": {"message": "status %d"}}`, s), s)
			return
		}
	}
	fmt.Fprintf(w, `{"choices": [{"message": {"role": "assistant", "content": %q}}]}`, f.reply(prompt))
}

// gradeByLine is a judge that reads "answer: X" and "reference: Y" lines of its prompt and says
// correct when they are equal.
func gradeByLine(prompt string) string {
	var ans, ref string
	for _, l := range strings.Split(prompt, "\n") {
		if v, ok := strings.CutPrefix(l, "answer: "); ok {
			ans = v
		}
		if v, ok := strings.CutPrefix(l, "reference: "); ok {
			ref = v
		}
	}
	if ans == ref {
		return "<think>maybe <verdict>incorrect</verdict>?</think> It matches. <verdict>correct</verdict>"
	}
	return "No. <verdict> Incorrect </verdict>"
}

const linePrompt = "question: {{.Question}}\nanswer: {{.Answer}}\nreference: {{.Reference}}"

func judgeConfig(url string) JudgeConfig {
	c := Defaults().Judge
	c.URL, c.Prompt = url, linePrompt
	return c
}

func newJudge(t *testing.T, c JudgeConfig) *Judge {
	t.Helper()
	j, err := NewJudge(c)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// Verdicts and scores are read from the last match of the pattern after any </think>.
func TestParse(t *testing.T) {
	j := newJudge(t, judgeConfig("http://127.0.0.1:1"))
	for reply, want := range map[string]float64{
		"<verdict>correct</verdict>":                                            1,
		"<verdict>CORRECT</verdict>":                                            1,
		"<verdict>correct</verdict> wait, <verdict>incorrect</verdict>":         0,
		"<think><verdict>correct</verdict></think><verdict>incorrect</verdict>": 0,
	} {
		if got, err := j.Parse(reply); err != nil || got != want {
			t.Errorf("Parse(%q) = %g, %v; want %g", reply, got, err, want)
		}
	}
	for _, reply := range []string{"", "correct", "<verdict>maybe</verdict>", "<think><verdict>correct</verdict></think>"} {
		if got, err := j.Parse(reply); err == nil {
			t.Errorf("Parse(%q) = %g, want an error", reply, got)
		}
	}
	c := judgeConfig("http://127.0.0.1:1")
	c.Pattern, c.Verdicts = `<score>(.*?)</score>`, nil
	num := newJudge(t, c)
	for reply, want := range map[string]float64{"<score>0.75</score>": 0.75, "<score> 1 </score>": 1, "<score>2</score><score>0</score>": 0} {
		if got, err := num.Parse(reply); err != nil || got != want {
			t.Errorf("score Parse(%q) = %g, %v; want %g", reply, got, err, want)
		}
	}
	for _, reply := range []string{"<score>1.5</score>", "<score>-0.1</score>", "<score>NaN</score>", "<score>high</score>"} {
		if got, err := num.Parse(reply); err == nil {
			t.Errorf("score Parse(%q) = %g, want an error", reply, got)
		}
	}
}

// Each distinct input is asked once: a repeat in the same batch and every later batch are cache hits
// with the first judgement's score; the prompt is the template over the input.
func TestJudgeCache(t *testing.T) {
	f := &fakeJudge{reply: gradeByLine}
	srv := httptest.NewServer(f)
	defer srv.Close()
	j := newJudge(t, judgeConfig(srv.URL))
	ins := []Input{
		{Question: "2+2", Answer: "4", References: []string{"4"}},
		{Question: "2+2", Answer: "5", References: []string{"4"}},
		{Question: "2+2", Answer: "4", References: []string{"4"}},         // the same as the first
		{Question: "1+3", Answer: "4", References: []string{"4"}},         // another question
		{Question: "2+2", Answer: "4", References: []string{"4", "four"}}, // another reference
	}
	vs := j.Judge(context.Background(), ins)
	want := []float64{1, 0, 1, 1, 0}
	asked, cached := 0, 0
	for i, v := range vs {
		if v.Err != nil || v.Score != want[i] {
			t.Errorf("input %d: %g, %v; want %g", i, v.Score, v.Err, want[i])
		}
		asked += b2i(v.Asked)
		cached += b2i(v.Cached)
	}
	if asked != 4 || cached != 1 || f.requests.Load() != 4 {
		t.Errorf("%d asked, %d cached, %d requests; want 4, 1, 4", asked, cached, f.requests.Load())
	}
	if all := strings.Join(f.prompts, "\n"); !strings.Contains(all, "question: 2+2\nanswer: 4\nreference: 4 | four") ||
		!strings.Contains(all, "question: 1+3\nanswer: 4\nreference: 4") {
		t.Errorf("prompts %q lack the rendered inputs", f.prompts)
	}
	again := j.Judge(context.Background(), ins)
	for i, v := range again {
		if !v.Cached || v.Asked || v.Score != want[i] {
			t.Errorf("second batch, input %d: %+v, want a cache hit scoring %g", i, v, want[i])
		}
	}
	if f.requests.Load() != 4 {
		t.Errorf("%d requests after the second batch, want still 4", f.requests.Load())
	}
	// The seed is a function of the request: the same input gets the same seed from a new judge.
	j2 := newJudge(t, judgeConfig(srv.URL))
	before := f.seeds["question: 2+2\nanswer: 4\nreference: 4"]
	j2.Judge(context.Background(), ins[:1])
	if after := f.seeds["question: 2+2\nanswer: 4\nreference: 4"]; after != before || before == 0 {
		t.Errorf("seeds %d and %d for the same input", before, after)
	}
}

// No more than max_concurrency requests are in flight, over concurrent callers too.
func TestJudgeConcurrencyBound(t *testing.T) {
	f := &fakeJudge{reply: gradeByLine, delay: 20 * time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := judgeConfig(srv.URL)
	c.MaxConcurrency = 3
	j := newJudge(t, c)
	var wg sync.WaitGroup
	for k := 0; k < 2; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ins []Input
			for i := 0; i < 12; i++ {
				ins = append(ins, Input{Question: fmt.Sprint(k, i), Answer: "1", References: []string{"1"}})
			}
			for _, v := range j.Judge(context.Background(), ins) {
				if v.Err != nil || v.Score != 1 {
					t.Errorf("%+v", v)
				}
			}
		}()
	}
	wg.Wait()
	if m := f.maxSeen.Load(); m != 3 {
		t.Errorf("at most %d requests in flight, want 3 (max_concurrency)", m)
	}
}

// A judge that does not reply in time is retried, then the verdict is a named timeout.
func TestJudgeTimeout(t *testing.T) {
	f := &fakeJudge{reply: gradeByLine, delay: 2 * time.Second}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := judgeConfig(srv.URL)
	c.Timeout, c.Retries = 50*time.Millisecond, 1
	v := newJudge(t, c).Judge(context.Background(), []Input{{Question: "q", Answer: "a"}})[0]
	var e *Error
	if !errors.As(v.Err, &e) || e.Kind != KindTimeout || e.Tries != 2 || f.requests.Load() != 2 {
		t.Fatalf("verdict %+v (%d requests), want a timeout after 2 tries", v, f.requests.Load())
	}
	if msg := v.Err.Error(); !strings.Contains(msg, "judge "+srv.URL+"/v1/chat/completions: timeout") || !strings.Contains(msg, "50ms") {
		t.Errorf("message %q does not name the endpoint and the timeout", msg)
	}
}

// A reply without a verdict is an unparseable failure quoting the reply, not retried; one that is
// not a chat completion is malformed.
func TestJudgeGarbage(t *testing.T) {
	f := &fakeJudge{reply: func(string) string { return "I like turtles" }}
	srv := httptest.NewServer(f)
	defer srv.Close()
	v := newJudge(t, judgeConfig(srv.URL)).Judge(context.Background(), []Input{{Question: "q", Answer: "a"}})[0]
	var e *Error
	if !errors.As(v.Err, &e) || e.Kind != KindUnparseable || e.Snippet != "I like turtles" || f.requests.Load() != 1 {
		t.Fatalf("verdict %+v, want an unparseable reply quoted, asked once", v)
	}
	if msg := v.Err.Error(); !strings.Contains(msg, "unparseable reply") || !strings.Contains(msg, `"I like turtles"`) || !strings.Contains(msg, srv.URL) {
		t.Errorf("message %q", msg)
	}
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>gateway</html>") }))
	defer html.Close()
	v = newJudge(t, judgeConfig(html.URL)).Judge(context.Background(), []Input{{Question: "q"}})[0]
	if !errors.As(v.Err, &e) || e.Kind != KindMalformed || !strings.Contains(v.Err.Error(), "<html>gateway</html>") {
		t.Errorf("a non-JSON reply: %v", v.Err)
	}
}

// An endpoint nobody listens on is retried, then named unreachable; nothing is cached, so the next
// batch asks again.
func TestJudgeUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	c := judgeConfig(url)
	c.Retries = 2
	j := newJudge(t, c)
	for k := 0; k < 2; k++ {
		v := j.Judge(context.Background(), []Input{{Question: "q", Answer: "a"}})[0]
		var e *Error
		if !errors.As(v.Err, &e) || e.Kind != KindUnreachable || e.Tries != 3 || !v.Asked || v.Cached {
			t.Fatalf("batch %d: verdict %+v, want unreachable after 3 tries", k, v)
		}
		if !strings.Contains(v.Err.Error(), "judge "+url+"/v1/chat/completions: unreachable") {
			t.Errorf("message %q", v.Err)
		}
	}
}

// 5xx and 429 are retried (a judge that recovers scores), 4xx are not and name the status.
func TestJudgeStatus(t *testing.T) {
	f := &fakeJudge{reply: gradeByLine, status: func(n int64) int {
		return map[int64]int{1: 503, 2: 429}[n] + 200*b2i(n > 2)
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	v := newJudge(t, judgeConfig(srv.URL)).Judge(context.Background(), []Input{{Answer: "4", References: []string{"4"}}})[0]
	if v.Err != nil || v.Score != 1 || f.requests.Load() != 3 {
		t.Fatalf("verdict %+v after %d requests, want 1 after 3", v, f.requests.Load())
	}
	bad := &fakeJudge{reply: gradeByLine, status: func(int64) int { return 400 }}
	srv2 := httptest.NewServer(bad)
	defer srv2.Close()
	v = newJudge(t, judgeConfig(srv2.URL)).Judge(context.Background(), []Input{{Answer: "4"}})[0]
	var e *Error
	if !errors.As(v.Err, &e) || e.Kind != KindStatus || e.Status != 400 || bad.requests.Load() != 1 ||
		!strings.Contains(v.Err.Error(), "HTTP 400 Bad Request") || !strings.Contains(v.Err.Error(), "status 400") {
		t.Errorf("a 400: %v after %d requests", v.Err, bad.requests.Load())
	}
}

// The key comes from the variable api_key_env names; a variable that is not set is an error naming it.
func TestJudgeAPIKeyEnv(t *testing.T) {
	f := &fakeJudge{reply: gradeByLine}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := judgeConfig(srv.URL)
	c.APIKeyEnv = "DRMAS_TEST_JUDGE_KEY_UNSET"
	if _, err := NewJudge(c); err == nil || !strings.Contains(err.Error(), "DRMAS_TEST_JUDGE_KEY_UNSET") {
		t.Errorf("an unset key variable: %v", err)
	}
	t.Setenv("DRMAS_TEST_JUDGE_KEY", "s3cret")
	c.APIKeyEnv = "DRMAS_TEST_JUDGE_KEY"
	newJudge(t, c).Judge(context.Background(), []Input{{Answer: "x"}})
	if len(f.auth) != 1 || f.auth[0] != "Bearer s3cret" {
		t.Errorf("Authorization headers %q", f.auth)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cache_entries bounds the cache, the oldest judgement evicted first; 0 turns it off.
func TestJudgeCacheBound(t *testing.T) {
	f := &fakeJudge{reply: gradeByLine}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := judgeConfig(srv.URL)
	c.CacheEntries = 2
	j := newJudge(t, c)
	in := func(q string) []Input { return []Input{{Question: q, Answer: "1", References: []string{"1"}}} }
	for _, q := range []string{"a", "b", "c", "c", "b", "a"} { // a evicted by c; b and c kept
		j.Judge(context.Background(), in(q))
	}
	if n := f.requests.Load(); n != 4 {
		t.Errorf("%d requests, want 4 (a, b, c, a again)", n)
	}
	c.CacheEntries = 0
	off := newJudge(t, c)
	off.Judge(context.Background(), in("a"))
	if v := off.Judge(context.Background(), in("a"))[0]; v.Cached || !v.Asked || f.requests.Load() != 6 {
		t.Errorf("cache_entries 0: %+v after %d requests", v, f.requests.Load())
	}
}
