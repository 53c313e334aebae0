package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseSGLangFixtures(t *testing.T) {
	var rep sglangReply
	if err := json.Unmarshal(fixture(t, "sglang_generate_logprob.json"), &rep); err != nil {
		t.Fatal(err)
	}
	res, err := parseSGLang("u", rep)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ids) != 1 || res.ids[0] != 5338 || res.logps[0] != float32(-0.014046513475477695) || res.finish != llm.FinishLength {
		t.Fatalf("parsed %+v", res)
	}

	// The docs' plain /generate reply has no log-probs: a named error, not an empty completion.
	rep = sglangReply{}
	if err := json.Unmarshal(fixture(t, "sglang_generate_docs.json"), &rep); err != nil {
		t.Fatal(err)
	}
	_, err = parseSGLang("u", rep)
	var re *ReplyError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "output_token_logprobs is missing") {
		t.Fatalf("docs reply without log-probs: err = %v", err)
	}
}

func TestParseCompletionFixtures(t *testing.T) {
	var rep completionReply
	if err := json.Unmarshal(fixture(t, "vllm_completion_token_ids.json"), &rep); err != nil {
		t.Fatal(err)
	}
	res, err := parseCompletion("u", rep, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !equalInts(res.ids, []int{28705, 31862}) || res.logps[1] != float32(-0.0021) || res.finish != llm.FinishLength {
		t.Fatalf("parsed %+v", res)
	}

	rep = completionReply{}
	if err := json.Unmarshal(fixture(t, "openai_completion_logprobs.json"), &rep); err != nil {
		t.Fatal(err)
	}
	if _, err := parseCompletion("u", rep, nil); err == nil || !strings.Contains(err.Error(), "not token_id") {
		t.Fatalf("text pieces without a piece table: err = %v", err)
	}
	pieces := map[string]int{"\n\n": 271, "This": 1986, " is": 374, " indeed": 12824, " a": 264, " test": 1273}
	res, err = parseCompletion("u", rep, func(s string) (int, bool) { id, ok := pieces[s]; return id, ok })
	if err != nil {
		t.Fatal(err)
	}
	if !equalInts(res.ids, []int{271, 1986, 374, 12824, 264, 1273}) || len(res.logps) != 6 {
		t.Fatalf("parsed %+v", res)
	}
	delete(pieces, " indeed")
	if _, err := parseCompletion("u", rep, func(s string) (int, bool) { id, ok := pieces[s]; return id, ok }); err == nil || !strings.Contains(err.Error(), `" indeed" is no single token`) {
		t.Fatalf("unknown piece: err = %v", err)
	}
}

func TestReloadFixtures(t *testing.T) {
	for _, tc := range []struct {
		reply, want string
	}{{"sglang_update_ok.json", ""}, {"sglang_update_fail.json", "repository not found"}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/get_model_info" {
				w.Write(fixture(t, "sglang_model_info.json"))
				return
			}
			w.Write(fixture(t, tc.reply))
		}))
		have, err := reloadFromDisk(context.Background(), srv.Client(), srv.URL, "/w/v1", "v1")
		srv.Close()
		if tc.want == "" && (err != nil || have != "default") {
			t.Errorf("%s: version %q, err %v", tc.reply, have, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.reply, err, tc.want)
		}
	}
}

// fake is a scripted SGLang replica: reply decides each /generate answer.
type fake struct {
	*httptest.Server
	calls   atomic.Int32
	reloads atomic.Int32
	version atomic.Value
	bodies  chan map[string]any
}

func newFake(t *testing.T, reply func(n int, req map[string]any, w http.ResponseWriter)) *fake {
	f := &fake{bodies: make(chan map[string]any, 100)}
	f.version.Store("default")
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req map[string]any
		_ = json.Unmarshal(body, &req)
		switch r.URL.Path {
		case "/health":
		case "/get_model_info":
			json.NewEncoder(w).Encode(map[string]any{"model_path": "m", "weight_version": f.version.Load()})
		case "/update_weights_from_disk":
			f.version.Store(req["weight_version"])
			f.reloads.Add(1)
			w.Write(fixture(t, "sglang_update_ok.json"))
		case "/generate":
			select {
			case f.bodies <- req:
			default:
			}
			reply(int(f.calls.Add(1)), req, w)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

// good answers with the first max_new_tokens prompt ids as the sampled tokens.
func good(_ int, req map[string]any, w http.ResponseWriter) {
	sp := req["sampling_params"].(map[string]any)
	n := int(sp["max_new_tokens"].(float64))
	var lps [][]any
	for _, id := range req["input_ids"].([]any)[:n] {
		lps = append(lps, []any{-0.5, id, nil})
	}
	json.NewEncoder(w).Encode(map[string]any{"text": "x", "meta_info": map[string]any{
		"finish_reason": map[string]any{"type": "length"}, "output_token_logprobs": lps}})
}

func toyCodec(t *testing.T) Codec {
	tok, err := tokenizer.Load("../../configs/toy/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	return Codec{Tok: tok, StopIDs: []int{0}, Prompt: func(m []llm.Message, _ map[string]any) ([]int, error) { return tok.Encode(m[len(m)-1].Content), nil }}
}

func requests(n int) []llm.Request {
	var out []llm.Request
	for i := 0; i < n; i++ {
		out = append(out, llm.Request{Agent: "a", Messages: []llm.Message{{Role: "user", Content: "abcdef"}},
			Sampling: llm.Sampling{Temperature: 1, MaxNewTokens: 3, Seed: int64(100 + i), Stop: []string{"</x>"}}})
	}
	return out
}

func client(t *testing.T, cfg Config) (*Client, error) {
	if cfg.Engine == "" {
		cfg.Engine = SGLang
	}
	if cfg.MaxInflight == 0 {
		cfg.MaxInflight = 4
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	return New(context.Background(), "m", cfg, toyCodec(t))
}

func TestSGLangRequestAndReply(t *testing.T) {
	f := newFake(t, good)
	c, err := client(t, Config{URLs: []string{f.URL}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Generate(context.Background(), requests(1))
	if err != nil {
		t.Fatal(err)
	}
	prompt := toyCodec(t).Tok.Encode("abcdef")
	if !equalInts(out[0].ResponseIDs, prompt[:3]) || !equalInts(out[0].PromptIDs, prompt) || out[0].LogProbs[2] != -0.5 || out[0].Replica != f.URL {
		t.Fatalf("completion %+v", out[0])
	}
	req := <-f.bodies
	sp := req["sampling_params"].(map[string]any)
	if sp["sampling_seed"].(float64) != 100 || req["return_logprob"] != true || sp["no_stop_trim"] != true ||
		sp["stop"].([]any)[0] != "</x>" || sp["stop_token_ids"].([]any)[0].(float64) != 0 || sp["top_k"].(float64) != -1 {
		t.Fatalf("request %v", req)
	}
}

func TestDownAtStart(t *testing.T) {
	f := newFake(t, good)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, err := client(t, Config{URLs: []string{f.URL, dead.URL}})
	if err == nil || !strings.Contains(err.Error(), dead.URL) || !strings.Contains(err.Error(), "not reachable") {
		t.Fatalf("err = %v, want one naming %s", err, dead.URL)
	}
}

func TestFailoverToHealthyReplica(t *testing.T) {
	broken := newFake(t, func(_ int, _ map[string]any, w http.ResponseWriter) { http.Error(w, "boom", 500) })
	healthy := newFake(t, good)
	c, err := client(t, Config{URLs: []string{broken.URL, healthy.URL}, Retries: 2})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Generate(context.Background(), requests(12))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 12 || broken.calls.Load() == 0 || healthy.calls.Load() != 12 {
		t.Fatalf("%d completions; broken got %d calls, healthy %d", len(out), broken.calls.Load(), healthy.calls.Load())
	}
}

func TestSlowReplicaTimesOut(t *testing.T) {
	slow := newFake(t, func(_ int, req map[string]any, w http.ResponseWriter) {
		time.Sleep(400 * time.Millisecond)
		good(0, req, w)
	})
	c, err := client(t, Config{URLs: []string{slow.URL}, Retries: 1, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Generate(context.Background(), requests(2))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), slow.URL) {
		t.Fatalf("err = %v, want ErrUnavailable naming the replica", err)
	}
	fast := newFake(t, good)
	c, err = client(t, Config{URLs: []string{slow.URL, fast.URL}, Retries: 2, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Generate(context.Background(), requests(4)); err != nil {
		t.Fatalf("a slow replica beside a fast one: %v", err)
	}
}

func TestMalformedReplies(t *testing.T) {
	for name, tc := range map[string]struct {
		body string
		want string
	}{
		"truncated":     {`{"text": "x", "meta_info": {"finish_reason": {"type": "len`, "not the expected JSON"},
		"no finish":     {`{"text": "x", "meta_info": {"output_token_logprobs": [[-1, 5, null]]}}`, "finish_reason is missing"},
		"empty":         {`{"text": "", "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": []}}`, "no sampled tokens"},
		"outside vocab": {`{"meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-1, 5, null], [-1, 99999, null], [-1, 5, null]]}}`, "outside the tokenizer's vocabulary"},
		"nan logprob":   {`{"meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[null, 5, null], [-1, 5, null], [-1, 5, null]]}}`, "not a number"},
		"too long":      {`{"meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-1, 5, null], [-1, 5, null], [-1, 5, null], [-1, 5, null]]}}`, "4 tokens for max_new_tokens 3"},
		"early length":  {`{"meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-1, 5, null]]}}`, `finish "length" after 1 tokens`},
		"stop no token": {`{"meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-1, 5, null]]}}`, "no stop token"},
		"aborted":       {`{"meta_info": {"finish_reason": {"type": "abort", "message": "weights updating"}, "output_token_logprobs": []}}`, "aborted the request: weights updating"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t, func(_ int, _ map[string]any, w http.ResponseWriter) { io.WriteString(w, tc.body) })
			c, err := client(t, Config{URLs: []string{f.URL}, Retries: 1})
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.Generate(context.Background(), requests(1))
			if err == nil || !strings.Contains(err.Error(), tc.want) || out != nil {
				t.Fatalf("err = %v, want one containing %q (and no completions, got %v)", err, tc.want, out)
			}
			if f.calls.Load() != 2 {
				t.Errorf("%d attempts, want 2 (retries: 1)", f.calls.Load())
			}
		})
	}
}

// TestOversizedReplyIsBounded: a replica that answers a 3-token request with a valid reply padded to
// 48 MB is an error naming it, and the client stops reading near the request's bound (about 1 MB
// here) instead of taking in the whole reply.
func TestOversizedReplyIsBounded(t *testing.T) {
	const padding = 48 << 20
	var written atomic.Int64
	f := newFake(t, func(_ int, req map[string]any, w http.ResponseWriter) {
		chunk := []byte(strings.Repeat("x", 64<<10))
		if _, err := io.WriteString(w, `{"padding": "`); err != nil {
			return
		}
		for n := 0; n < padding; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return // the client hung up
			}
			written.Add(int64(len(chunk)))
		}
		ids := req["input_ids"].([]any)[:3]
		fmt.Fprintf(w, `", "text": "x", "meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5, %v, null], [-0.5, %v, null], [-0.5, %v, null]]}}`, ids[0], ids[1], ids[2])
	})
	c, err := client(t, Config{URLs: []string{f.URL}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Generate(context.Background(), requests(1))
	if err == nil || !strings.Contains(err.Error(), f.URL) || !strings.Contains(err.Error(), "larger than its bound") {
		t.Fatalf("err = %v, want a reply-size error naming %s", err, f.URL)
	}
	time.Sleep(100 * time.Millisecond) // let the handler see the closed connection
	if w := written.Load(); w > 16<<20 {
		t.Fatalf("the replica got %d MB of its reply out: the client read far past the bound", w>>20)
	}
	t.Logf("%v; the replica wrote %.1f MB before the client hung up", err, float64(written.Load())/(1<<20))
}

func TestBadRequestIsNotRetried(t *testing.T) {
	f := newFake(t, func(_ int, _ map[string]any, w http.ResponseWriter) {
		http.Error(w, `{"error": "input too long"}`, 400)
	})
	c, err := client(t, Config{URLs: []string{f.URL}, Retries: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Generate(context.Background(), requests(1)); err == nil || !strings.Contains(err.Error(), "input too long") || errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("%d attempts, want 1", f.calls.Load())
	}
}

func TestSyncRecordsVersionsAndDetectsStaleReplica(t *testing.T) {
	a, b := newFake(t, good), newFake(t, good)
	c, err := client(t, Config{URLs: []string{a.URL, b.URL}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(context.Background(), "/run/weights/m/v1", llm.StepVersion(1)); err != nil {
		t.Fatal(err)
	}
	if v := c.Versions(); v[a.URL].String() != "v1" || v[b.URL].String() != "v1" {
		t.Fatalf("versions %v", v)
	}
	// A replica that acknowledges the reload but keeps serving the old weights.
	stale := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/update_weights_from_disk":
			w.Write(fixture(t, "sglang_update_ok.json"))
		default:
			json.NewEncoder(w).Encode(map[string]any{"model_path": "m", "weight_version": "v1"})
		}
	}))
	defer stale.Close()
	c, err = client(t, Config{URLs: []string{a.URL, stale.URL}})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Sync(context.Background(), "/run/weights/m/v2", llm.StepVersion(2))
	var se *StaleError
	if !errors.As(err, &se) || se.URL != stale.URL || se.Have != "v1" {
		t.Fatalf("err = %v, want a StaleError for %s", err, stale.URL)
	}
}

func TestSyncTakesDeadReplicaOutOfRotation(t *testing.T) {
	a, b := newFake(t, good), newFake(t, good)
	c, err := client(t, Config{URLs: []string{a.URL, b.URL}, Retries: 1})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := c.Sync(context.Background(), "/w/v1", llm.StepVersion(1)); err != nil {
		t.Fatal(err)
	}
	if v := c.Versions(); v[a.URL].String() != "v1" || v[b.URL].String() != "" {
		t.Fatalf("versions %v", v)
	}
	if _, err := c.Generate(context.Background(), requests(5)); err != nil {
		t.Fatal(err)
	}
	if a.calls.Load() != 5 {
		t.Fatalf("the live replica got %d of 5 requests", a.calls.Load())
	}
	a.Close()
	if err := c.Sync(context.Background(), "/w/v2", llm.StepVersion(2)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no replica left: err = %v", err)
	}
}

// Rejoin backs off: a replica out of rotation whose reload fails again is not tried at the next
// Rejoin (30 s later at the earliest), so a dead replica does not cost every iteration a timeout.
func TestRejoinBacksOff(t *testing.T) {
	a := newFake(t, good)
	var reloads atomic.Int32
	var broken atomic.Bool
	broken.Store(true)
	x := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/get_model_info":
			json.NewEncoder(w).Encode(map[string]any{"model_path": "m", "weight_version": "v1"})
		case "/update_weights_from_disk":
			reloads.Add(1)
			if broken.Load() {
				http.Error(w, "out of memory", http.StatusInternalServerError)
				return
			}
			w.Write(fixture(t, "sglang_update_ok.json"))
		}
	}))
	defer x.Close()
	c, err := client(t, Config{URLs: []string{a.URL, x.URL}, Retries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(context.Background(), "/w/v1", llm.StepVersion(1)); err != nil {
		t.Fatal(err)
	}
	if v := c.Versions(); v[x.URL].String() != "" {
		t.Fatalf("versions %v: the broken replica is in rotation", v)
	}
	n := reloads.Load()
	if back := c.Rejoin(context.Background(), "/w/v1", llm.StepVersion(1)); back != 0 || reloads.Load() != n+1 {
		t.Fatalf("Rejoin of a broken replica: %d back, %d reloads (want 0 back, 1 reload)", back, reloads.Load()-n)
	}
	broken.Store(false)
	if back := c.Rejoin(context.Background(), "/w/v1", llm.StepVersion(1)); back != 0 || reloads.Load() != n+1 {
		t.Errorf("Rejoin right after a failed one: %d back, %d reloads (want none tried: back-off)", back, reloads.Load()-n)
	}
}

// Config.APIKey goes to every request (health check, generation, reload) as a Bearer token.
func TestAPIKeySentWithEveryRequest(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{}
	f := newFake(t, good)
	keyed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Get("Authorization")
		mu.Unlock()
		r.URL.Scheme, r.URL.Host = "http", strings.TrimPrefix(f.URL, "http://")
		resp, err := http.DefaultTransport.RoundTrip(r.Clone(r.Context()))
		if err != nil {
			http.Error(w, err.Error(), 502)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer keyed.Close()
	c, err := client(t, Config{URLs: []string{keyed.URL}, APIKey: "k-123"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Generate(context.Background(), requests(1)); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(context.Background(), "/w/v1", llm.StepVersion(1)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/health", "/get_model_info", "/generate", "/update_weights_from_disk"} {
		if seen[p] != "Bearer k-123" {
			t.Errorf("%s: Authorization %q, want Bearer k-123", p, seen[p])
		}
	}
}

// Every registered kind but the trainer's own local engine has a protocol here.
func TestKindsHaveProtocols(t *testing.T) {
	for _, kind := range Kinds.Names() {
		if _, err := protocolFor(kind); (err == nil) == (kind == Local) {
			t.Errorf("engine %q: protocol error %v", kind, err)
		}
	}
}

// Replicas reload in turn while a rollout still runs: ReloadIdle loads the next weights on a replica
// with nothing in flight, never on the last one serving the current weights, and a replica so
// reloaded takes no request until Sync makes its version current; Sync then reloads only the others.
func TestReloadIdleInTurn(t *testing.T) {
	gate := make(chan struct{})
	blocking := func(n int, req map[string]any, w http.ResponseWriter) {
		<-gate
		good(n, req, w)
	}
	a, b := newFake(t, blocking), newFake(t, blocking)
	c, err := client(t, Config{URLs: []string{a.URL, b.URL}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Sync(ctx, "/run/weights/m/v1", llm.StepVersion(1)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	send := func() {
		go func() {
			comps, err := c.Generate(ctx, requests(1))
			if err == nil && comps[0].Version.String() != "v1" {
				err = fmt.Errorf("a request of the rollout was answered by %q", comps[0].Version)
			}
			done <- err
		}()
	}
	send()
	for a.calls.Load()+b.calls.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	busy, idle := a, b
	if b.calls.Load() == 1 {
		busy, idle = b, a
	}
	n, err := c.ReloadIdle(ctx, "/run/weights/m/v2", llm.StepVersion(2))
	if err != nil || n != 1 || idle.version.Load() != "v2" || busy.version.Load() != "v1" {
		t.Fatalf("ReloadIdle: %d reloaded, err %v; versions busy %v idle %v; want the idle one at v2", n, err, busy.version.Load(), idle.version.Load())
	}
	if n, _ := c.ReloadIdle(ctx, "/run/weights/m/v2", llm.StepVersion(2)); n != 0 {
		t.Fatalf("ReloadIdle reloaded the last replica serving the current weights")
	}
	send() // the rollout's next request: only the busy replica serves v1
	for busy.calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(gate)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if idle.calls.Load() != 0 {
		t.Fatalf("the replica reloaded ahead answered %d requests before its version was current", idle.calls.Load())
	}
	if err := c.Sync(ctx, "/run/weights/m/v2", llm.StepVersion(2)); err != nil {
		t.Fatal(err)
	}
	if busy.reloads.Load() != 2 || idle.reloads.Load() != 2 {
		t.Fatalf("reloads: busy %d, idle %d; want 2 each (v1, then v2 once)", busy.reloads.Load(), idle.reloads.Load())
	}
	comps, err := c.Generate(ctx, requests(4))
	if err != nil {
		t.Fatal(err)
	}
	for _, comp := range comps {
		if comp.Version.String() != "v2" {
			t.Fatalf("after the sync a request was answered by %q", comp.Version)
		}
	}
	if idle.calls.Load() == 0 {
		t.Fatal("the replica reloaded ahead takes no request after the sync")
	}
}
