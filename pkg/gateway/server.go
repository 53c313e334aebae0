package gateway

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/toolcall"
)

// The gateway's endpoint: an OpenAI-compatible server on loopback whose every episode has a base URL
// of its own (…/sessions/<id>/v1) and a key of its own. A call names its agent as the model; the
// gateway samples it with the agent's model and settings and records the exact prompt ids, sampled
// ids and log-probs as a call of the episode, in arrival order.

// agentSpec is what the endpoint knows of one agent.
type agentSpec struct {
	name, model string
	sampling0   llm.Sampling
	kwargs      map[string]any
	format      toolcall.Format // how its model writes tool calls ("" unknown: tools refused)
	roleWeight  float64
	maxPrompt   int // data.max_prompt_length (0: the context): a longer prompt is an overlong call
}

// session is one episode's connection to the endpoint.
type session struct {
	id, key string
	gen     llm.Generator
	opts    env.RunOptions
	taskID  string
	sample  int
	clock   *clock // the rollout's

	mu      sync.Mutex
	calls   []*env.Call // in the order the calls arrived (nil: a call that failed)
	ended   bool
	genTime time.Duration
}

// server is the endpoint.
type server struct {
	agents map[string]*agentSpec
	ln     net.Listener
	srv    *http.Server
	base   string

	mu       sync.Mutex
	sessions map[string]*session
	ended    []string // ids of ended sessions, oldest first: kept (for 409s) up to maxEnded
	n        int64    // sessions opened, for their ids
}

// maxEnded is how many ended episodes stay known, so that a late call gets 409 rather than 404; older
// ones are forgotten (a run of many iterations would otherwise keep every episode it ever played).
const maxEnded = 1 << 14

// newServer starts the endpoint on a loopback port.
func newServer(agents map[string]*agentSpec) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("gateway: listen on loopback: %w", err)
	}
	s := &server{agents: agents, ln: ln, base: "http://" + ln.Addr().String(), sessions: map[string]*session{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sessions/{sid}/v1/chat/completions", s.chat)
	mux.HandleFunc("POST /sessions/{sid}/v1/completions", s.completions)
	mux.HandleFunc("GET /sessions/{sid}/v1/models", s.models)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// close stops the endpoint.
func (s *server) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

// randomHex is n random bytes as hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// open starts an episode's session: its base URL and key.
func (s *server) open(gen llm.Generator, clk *clock, opts env.RunOptions, taskID string, sample int) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	se := &session{id: fmt.Sprintf("e%d-%s", s.n, randomHex(4)), key: "sk-drmas-" + randomHex(16), gen: gen, opts: opts, taskID: taskID, sample: sample, clock: clk}
	s.sessions[se.id] = se
	return se
}

// baseURL is the OpenAI-compatible base URL of a session.
func (s *server) baseURL(se *session) string { return s.base + "/sessions/" + se.id + "/v1" }

// end closes a session and returns the calls the episode made: later calls are refused (409; the
// session stays known, without its calls, for that).
func (s *server) end(se *session) []env.Call {
	se.mu.Lock()
	se.ended = true
	var out []env.Call
	for _, c := range se.calls {
		if c != nil {
			out = append(out, *c)
		}
	}
	se.calls, se.gen = nil, nil
	se.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = append(s.ended, se.id)
	if len(s.ended) > maxEnded {
		delete(s.sessions, s.ended[0])
		s.ended = s.ended[1:]
	}
	return out
}

// authorize finds the request's session and checks its key: 401 without the key, 404 for a session
// the gateway never opened, 409 for one whose episode is over.
func (s *server) authorize(w http.ResponseWriter, r *http.Request) *session {
	sid := r.PathValue("sid")
	s.mu.Lock()
	se := s.sessions[sid]
	s.mu.Unlock()
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if se == nil {
		writeError(w, &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("no episode %q is open (its episode ended, or it never was): each episode has its own base_url", sid), Type: "invalid_request_error", Code: "episode_not_found"})
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(key), []byte(se.key)) != 1 {
		writeError(w, &apiError{status: http.StatusUnauthorized, Message: "missing or wrong API key: send the episode's api_key as \"Authorization: Bearer <key>\"", Type: "invalid_request_error", Code: "invalid_api_key"})
		return nil
	}
	se.mu.Lock()
	ended := se.ended
	se.mu.Unlock()
	if ended {
		writeError(w, &apiError{status: http.StatusConflict, Message: fmt.Sprintf("episode %s has ended: its calls are recorded", sid), Type: "invalid_request_error", Code: "episode_ended"})
		return nil
	}
	return se
}

// agent finds the agent a request names as its model (404 naming the agents otherwise).
func (s *server) agent(model string) (*agentSpec, *apiError) {
	if a := s.agents[model]; a != nil {
		return a, nil
	}
	names := make([]string, 0, len(s.agents))
	for n := range s.agents {
		names = append(names, n)
	}
	return nil, &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("model %q is not an agent of this team: name the agent as the model (one of %s)", model, strings.Join(sortedNames(names), ", ")),
		Type: "invalid_request_error", Param: "model", Code: "model_not_found"}
}

// request is an endpoint's request body: the fields both endpoints take, and the endpoint's own.
type request interface {
	params() *callParams
	// overlong is the error of a prompt of tokens that leaves no room in agent's model's context.
	overlong(tokens int, agent string) *apiError
}

// served is a call the endpoint generated: its episode, its agent, the agent's request and the
// completions, the first at the episode's call position first, each taking took of the generation.
type served struct {
	se    *session
	a     *agentSpec
	lr    llm.Request
	comps []llm.Completion
	first int
	took  time.Duration
}

// handle is what both endpoints do around their own parts: it checks the episode's key and counts
// the request's time in the endpoint, reads the body into req, finds the agent it names, generates
// the call build makes for that agent and has respond answer with the completions. An error on the
// way, a prompt too long for the agent's model's context among them, is answered as OpenAI's error
// body.
func (s *server) handle(w http.ResponseWriter, r *http.Request, req request, build func(*agentSpec) (llm.Request, int, *apiError), respond func(*served)) {
	se := s.authorize(w, r)
	if se == nil {
		return
	}
	defer se.serving()()
	if e := decodeBody(r, req); e != nil {
		writeError(w, e)
		return
	}
	a, e := s.agent(req.params().Model)
	if e != nil {
		writeError(w, e)
		return
	}
	lr, n, e := build(a)
	if e != nil {
		writeError(w, e)
		return
	}
	comps, first, took, err := se.generate(r.Context(), a, lr, n)
	if err != nil {
		logFailure(se, a.name, err)
		writeError(w, &apiError{status: http.StatusInternalServerError, Message: "generation failed: " + err.Error(), Type: "server_error"})
		return
	}
	for _, c := range comps { // the prompt is the same for every choice: all fit or none
		if c.Finish == llm.FinishOverlong {
			writeError(w, req.overlong(len(c.PromptIDs), a.name))
			return
		}
	}
	respond(&served{se: se, a: a, lr: lr, comps: comps, first: first, took: took / time.Duration(len(comps))})
}

// head begins the answer: an id of the endpoint's prefix, the episode and the first call's position;
// the endpoint's object; the time; the agent as the model.
func (c *served) head(prefix, object string) answerHead {
	return answerHead{ID: prefix + "-" + c.se.id + "-" + strconv.Itoa(c.first), Object: object, Created: time.Now().Unix(), Model: c.a.name}
}

// record makes completion i a call of the episode.
func (c *served) record(i int, valid bool) {
	c.se.call(c.a, c.first+i, c.lr, c.comps[i], valid, c.took)
}

// usage counts the answer's tokens: the one prompt once (as OpenAI does), every completion's own.
func (c *served) usage() usage {
	var u usage
	for _, comp := range c.comps {
		u.PromptTokens += len(comp.PromptIDs)
		u.CompletionTokens += len(comp.ResponseIDs)
	}
	u.PromptTokens /= max(len(c.comps), 1)
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// models lists the team's agents as models.
func (s *server) models(w http.ResponseWriter, r *http.Request) {
	if s.authorize(w, r) == nil {
		return
	}
	var data []map[string]any
	for _, n := range sortedNames(keys(s.agents)) {
		data = append(data, map[string]any{"id": n, "object": "model", "owned_by": "drmas"})
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

// reserve takes the next call positions of an episode for n choices: a call's position fixes its
// sampling seed (env.SampleSeed), as the built-in orchestras' calls do. It returns the first
// position and the episode's generator (nil once the episode has ended).
func (se *session) reserve(n int) (int, llm.Generator) {
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.ended {
		return 0, nil
	}
	first := len(se.calls)
	se.calls = append(se.calls, make([]*env.Call, n)...)
	return first, se.gen
}

// serving counts a request's time in the endpoint (time/gateway/http); call what it returns when the
// answer is written.
func (se *session) serving() func() {
	se.clock.serve.enter()
	return se.clock.serve.leave
}

// record puts a finished call at its position.
func (se *session) record(pos int, c env.Call, took time.Duration) {
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.ended || pos >= len(se.calls) { // a call the runner did not wait for: not the episode's
		return
	}
	se.calls[pos] = &c
	se.genTime += took
}

// generate samples n completions of the request for agent a, each one call of the episode at its
// reserved position (the first returned), and how long the generation took.
func (se *session) generate(ctx context.Context, a *agentSpec, req llm.Request, n int) ([]llm.Completion, int, time.Duration, error) {
	first, gen := se.reserve(n)
	if gen == nil {
		return nil, 0, 0, fmt.Errorf("episode %s ended while the call waited", se.id)
	}
	traj := &env.Trajectory{TaskID: se.taskID, Sample: se.sample}
	reqs := make([]llm.Request, n)
	for i := range reqs {
		reqs[i] = req
		reqs[i].Sampling.Seed = env.SampleSeed(se.opts, a.name, traj, first+i)
	}
	began := time.Now()
	comps, err := gen.Generate(ctx, reqs)
	if err == nil && len(comps) != n {
		err = fmt.Errorf("%d completions for %d requests", len(comps), n)
	}
	if err != nil {
		return nil, 0, 0, err
	}
	return comps, first, time.Since(began), nil
}

// call records choice i of a generation as a call of the episode (its transcript's prompt: a
// completion's text, a chat call's last message).
func (se *session) call(a *agentSpec, pos int, req llm.Request, c llm.Completion, valid bool, took time.Duration) {
	prompt := req.Text
	if n := len(req.Messages); n > 0 { // a chat call: its last message, as a built-in orchestra's prompt
		prompt = req.Messages[n-1].Content
	}
	se.record(pos, env.Call{Agent: a.name, Model: a.model, Turn: pos + 1, Prompt: prompt, Messages: req.Messages, Response: c.Text,
		Valid: valid, PromptIDs: c.PromptIDs, ResponseIDs: c.ResponseIDs, LogProbs: c.LogProbs, Finish: c.Finish,
		Replica: c.Replica, Version: c.Version, Routes: c.Routes}, took)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func sortedNames(s []string) []string {
	slices.Sort(s)
	return s
}

// logFailure logs a call the gateway could not serve.
func logFailure(se *session, model string, err error) {
	log.Warn().Str("episode", se.id).Str("agent", model).Err(err).Msg("gateway: a call failed")
}
