package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
)

// fakeGen answers every request with its agent's name, the number of messages and the seed,
// recording what it was asked; prompt ids stand for the messages, response ids for the answer.
type fakeGen struct {
	mu   sync.Mutex
	reqs []llm.Request
}

func (g *fakeGen) Generate(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	g.mu.Lock()
	g.reqs = append(g.reqs, reqs...)
	g.mu.Unlock()
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		text := fmt.Sprintf("%s:%d", r.Agent, len(r.Messages))
		if tools, _ := json.Marshal(r.ChatTemplateKwargs["tools"]); strings.Contains(string(tools), "lookup") {
			text = `<tool_call>{"name": "lookup", "arguments": {"key": "c"}}</tool_call>`
		}
		out[i] = llm.Completion{Text: text, PromptIDs: []int{len(r.Messages), 7}, ResponseIDs: []int{int(r.Sampling.Seed % 1000), 2},
			LogProbs: []float32{-0.5, -0.25}, Finish: llm.FinishStop}
	}
	return out, nil
}

// newTestGateway builds a gateway of two agents (solver, verifier) over the runner at url.
func newTestGateway(t *testing.T, cfg Config) *Gateway {
	t.Helper()
	temp := 1.0
	agents := []env.AgentConfig{
		{Name: "solver", Model: "m", Sampling: env.SamplingConfig{Temperature: &temp, MaxNewTokens: 8}, ToolFormat: "hermes", MaxPromptTokens: 4096},
		{Name: "verifier", Model: "m", Sampling: env.SamplingConfig{Temperature: &temp, MaxNewTokens: 4}, Reward: env.RewardConfig{RoleWeight: 0.5}},
	}
	o, err := build(env.OrchestraConfig{Type: Type}, agents, cfg, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	g := o.(*Gateway)
	t.Cleanup(func() { g.Close() })
	return g
}

// post sends a JSON body to an episode's endpoint with its key.
func post(t *testing.T, base, key, path string, body any) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, out
}

// runnerFunc is a runner over an http handler of the episode.
func runnerFunc(t *testing.T, play func(w http.ResponseWriter, req runRequest)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/run" {
			http.NotFound(w, r)
			return
		}
		var req runRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		play(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A two-agent episode through the endpoint: the solver, then the verifier, called as models with the
// episode's key; the calls come back in order with the ids the generator sampled and seeds that are
// the built-in orchestras' (position in the episode), scored with the runner's reward and role
// rewards; the runner's view of the task is the record.
func TestEpisodeCallsRecorded(t *testing.T) {
	var got runRequest
	var mu sync.Mutex
	url := runnerFunc(t, func(w http.ResponseWriter, req runRequest) {
		mu.Lock()
		got = req
		mu.Unlock()
		for _, agent := range []string{"solver", "verifier"} {
			resp, body := post(t, req.BaseURL, req.APIKey, "/chat/completions", map[string]any{"model": agent,
				"messages": []map[string]string{{"role": "user", "content": "2+3?"}}, "temperature": 1.0})
			if resp.StatusCode != 200 {
				t.Errorf("%s: HTTP %d %s", agent, resp.StatusCode, body)
			}
			var cr chatResponse
			_ = json.Unmarshal(body, &cr)
			if cr.Model != agent || len(cr.Choices) != 1 || *cr.Choices[0].Message.Content != agent+":1" {
				t.Errorf("%s: answer %s", agent, body)
			}
		}
		fmt.Fprint(w, `{"reward": 1, "agent_rewards": {"verifier": 0.25}}`)
	})
	g := newTestGateway(t, Config{URL: url})
	gen := &fakeGen{}
	task := env.Task{ID: "t1", Question: "2+3?", Record: json.RawMessage(`{"q":"2+3?","gold":5}`)}
	roll, err := g.Run(context.Background(), gen, []env.Task{task}, 2, env.RunOptions{Iteration: 3, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if len(roll.Trajectories) != 2 || string(got.Task) != `{"q":"2+3?","gold":5}` || strings.Join(got.Agents, ",") != "solver,verifier" {
		t.Fatalf("rollout %+v, runner got %+v", roll, got)
	}
	for s, tr := range roll.Trajectories {
		if tr.UID != "0:t1" || tr.Sample != s || len(tr.Calls) != 2 || tr.Calls[0].Agent != "solver" || tr.Calls[1].Agent != "verifier" {
			t.Fatalf("trajectory %d: %+v", s, tr)
		}
		for k, c := range tr.Calls {
			seed := env.SampleSeed(env.RunOptions{Iteration: 3, Seed: 9}, c.Agent, &env.Trajectory{TaskID: "t1", Sample: s}, k)
			if c.ResponseIDs[0] != int(seed%1000) || c.PromptIDs[0] != 1 || c.LogProbs[1] != -0.25 {
				t.Errorf("trajectory %d call %d: ids %v %v, want the seed of position %d", s, k, c.PromptIDs, c.ResponseIDs, k)
			}
		}
		if tr.Reward != 1 || tr.Calls[0].Score != 1 || tr.Calls[1].Score != 0.5*1+0.5*0.25 {
			t.Errorf("trajectory %d: reward %g, scores %g %g", s, tr.Reward, tr.Calls[0].Score, tr.Calls[1].Score)
		}
	}
}

// The endpoint's refusals: no key 401, another episode's key 401, an unknown agent 404, a sampling
// parameter other than the agent's 400 (naming it), an unimplemented response_format 400, a call
// after the episode 409; max_tokens only lowers; tools come back as OpenAI tool_calls; streaming.
func TestEndpointRefusalsAndShapes(t *testing.T) {
	var base, key string
	var once sync.Once
	hold := make(chan struct{})
	url := runnerFunc(t, func(w http.ResponseWriter, req runRequest) {
		once.Do(func() { base, key = req.BaseURL, req.APIKey; close(hold) })
		<-time.After(300 * time.Millisecond)
		fmt.Fprint(w, `{"reward": 0}`)
	})
	g := newTestGateway(t, Config{URL: url})
	gen := &fakeGen{}
	done := make(chan error, 1)
	go func() {
		_, err := g.Run(context.Background(), gen, []env.Task{{ID: "t"}}, 1, env.RunOptions{})
		done <- err
	}()
	<-hold
	msgs := []map[string]string{{"role": "user", "content": "x"}}
	for _, c := range []struct {
		key    string
		body   map[string]any
		status int
		says   string
	}{
		{"", map[string]any{"model": "solver", "messages": msgs}, 401, "API key"},
		{"sk-drmas-wrong", map[string]any{"model": "solver", "messages": msgs}, 401, "API key"},
		{key, map[string]any{"model": "nobody", "messages": msgs}, 404, "solver, verifier"},
		{key, map[string]any{"model": "solver", "messages": msgs, "temperature": 0.7}, 400, "temperature 0.7 differs"},
		{key, map[string]any{"model": "solver", "messages": msgs, "top_k": 5}, 400, "top_k"},
		{key, map[string]any{"model": "solver", "messages": msgs, "presence_penalty": 0.5}, 400, "presence_penalty"},
		{key, map[string]any{"model": "solver", "messages": msgs, "response_format": map[string]string{"type": "json_object"}}, 400, "response_format"},
		{key, map[string]any{"model": "solver", "messages": msgs, "top_p": 1, "temperature": 1, "max_tokens": 3}, 200, ""},
	} {
		resp, body := post(t, base, c.key, "/chat/completions", c.body)
		if resp.StatusCode != c.status || !strings.Contains(string(body), c.says) {
			t.Errorf("%v: HTTP %d %s, want %d naming %q", c.body, resp.StatusCode, body, c.status, c.says)
		}
	}
	if last := gen.reqs[len(gen.reqs)-1]; last.Sampling.MaxNewTokens != 3 || last.MaxPromptTokens != 4096 || !last.FitContext {
		t.Errorf("max_tokens 3: the agent sampled %d new tokens, its prompt bound %d (data.max_prompt_length 4096), fit %v",
			last.Sampling.MaxNewTokens, last.MaxPromptTokens, last.FitContext)
	}
	// Tools: the call comes back as tool_calls with string arguments, streamed too.
	tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{"type": "object"}}}}
	resp, body := post(t, base, key, "/chat/completions", map[string]any{"model": "solver", "messages": msgs, "tools": tools})
	var cr chatResponse
	_ = json.Unmarshal(body, &cr)
	if resp.StatusCode != 200 || cr.Choices[0].FinishReason != "tool_calls" || cr.Choices[0].Message.ToolCalls[0].Function.Name != "lookup" ||
		string(cr.Choices[0].Message.ToolCalls[0].Function.Arguments) != `"{\"key\": \"c\"}"` {
		t.Errorf("tools: HTTP %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, base, key, "/chat/completions", map[string]any{"model": "verifier", "messages": msgs, "stream": true, "stream_options": map[string]bool{"include_usage": true}})
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"content":"verifier:1"`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || !strings.Contains(string(body), `"usage"`) {
		t.Errorf("stream: HTTP %d %s", resp.StatusCode, body)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if resp, body := post(t, base, key, "/chat/completions", map[string]any{"model": "solver", "messages": msgs}); resp.StatusCode != 409 {
		t.Errorf("after the episode: HTTP %d %s, want 409", resp.StatusCode, body)
	}
}

// Bad runners: each a bounded, named failure. One that answers 500, NaN, a reward that is not a
// number, 10 MB, or hangs past runner.timeout fails its episodes after the attempts, which are left
// out and counted (never scored 0); one that is not there stops the run naming its URL.
func TestBadRunners(t *testing.T) {
	big := strings.Repeat("x", 10<<20)
	for name, play := range map[string]func(w http.ResponseWriter){
		"500":        func(w http.ResponseWriter) { http.Error(w, "boom", 500) },
		"NaN":        func(w http.ResponseWriter) { fmt.Fprint(w, `{"reward": NaN}`) },
		"not number": func(w http.ResponseWriter) { fmt.Fprint(w, `{"reward": "1"}`) },
		"10 MB":      func(w http.ResponseWriter) { fmt.Fprintf(w, `{"reward": 1, "pad": %q}`, big) },
		"1e300":      func(w http.ResponseWriter) { fmt.Fprint(w, `{"reward": 1e300}`) },
		"hang":       func(w http.ResponseWriter) { time.Sleep(2 * time.Second) },
	} {
		t.Run(name, func(t *testing.T) {
			var posts atomic.Int64
			url := runnerFunc(t, func(w http.ResponseWriter, _ runRequest) { posts.Add(1); play(w) })
			g := newTestGateway(t, Config{URL: url, Timeout: 300 * time.Millisecond, Attempts: 2})
			_, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "t"}}, 2, env.RunOptions{})
			if err == nil || !strings.Contains(err.Error(), "every one of the 2 episodes failed") {
				t.Errorf("err = %v", err)
			}
			if posts.Load() != 4 {
				t.Errorf("%d POSTs, want 2 episodes × 2 attempts", posts.Load())
			}
		})
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	g := newTestGateway(t, Config{URL: dead, Attempts: 2})
	_, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "t"}}, 1, env.RunOptions{})
	if err == nil || !strings.Contains(err.Error(), "runner unreachable") || !strings.Contains(err.Error(), dead) {
		t.Errorf("no runner: err = %v, want one naming %s", err, dead)
	}
}

// One episode failing while the others succeed: it is left out and counted.
func TestFailedEpisodeLeftOutAndCounted(t *testing.T) {
	url := runnerFunc(t, func(w http.ResponseWriter, req runRequest) {
		if strings.HasSuffix(req.EpisodeID, "#1") {
			http.Error(w, "no", 500)
			return
		}
		fmt.Fprint(w, `{"reward": 0.5}`)
	})
	g := newTestGateway(t, Config{URL: url, Attempts: 2})
	roll, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "t"}}, 3, env.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(roll.Trajectories) != 2 || roll.RewardStats[MetricFailed] != 1 || roll.RewardStats[MetricRetried] != 1 {
		t.Errorf("%d trajectories, stats %v", len(roll.Trajectories), roll.RewardStats)
	}
	for _, tr := range roll.Trajectories {
		if tr.Reward != 0.5 || strings.HasSuffix(tr.TrajUID, "#1") {
			t.Errorf("trajectory %s reward %g", tr.TrajUID, tr.Reward)
		}
	}
}
