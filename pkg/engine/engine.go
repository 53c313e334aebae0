package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/rs/zerolog/log"
)

// Kinds are the values of models[].rollout.engine: where a model's rollouts are sampled. Local is
// the trainer's own policy (pkg/train); each other kind is spoken to with its protocol.
var Kinds = choice.NewSet("engine")

// protocols are the kinds' protocols (Local has none).
var protocols = map[string]protocol{}

// kind registers an engine kind spoken with p: a new engine is its protocol's file plus one line
// below.
func kind(name string, p protocol) string {
	if p != nil {
		protocols[name] = p
	}
	return Kinds.Add(name)
}

// Kinds of engine.
var (
	Local  = kind("local", nil)                    // in-process, on the trained weights (no replicas)
	SGLang = kind("sglang", sglang{})              // native /generate with input_ids; /update_weights_from_disk
	VLLM   = kind("vllm", openaiProto{vllm: true}) // OpenAI-compatible /v1/completions with token-id prompts; dev-mode reload
	OpenAI = kind("openai", openaiProto{})         // the plain OpenAI /v1/completions subset; reload as SGLang does
	// Managed: drmas serve replicas that drmas train starts, supervises and stops itself (pkg/replica),
	// spoken to as SGLang.
	Managed = kind("managed", sglang{})
)

// Codec is what the Client needs of the trained model to own tokenization: its prompt encoder (chat
// template + tokenizer, exactly as local generation), its tokenizer (to decode replies and check
// ids) and its stop tokens (end-of-turn and EOS ids, sent to the engine so it stops where the local
// policy stops).
type Codec struct {
	Prompt  func(msgs []llm.Message, chatTemplateKwargs map[string]any) ([]int, error)
	Tok     *tokenizer.Tokenizer
	StopIDs []int
	// Routes is what a mixture-of-experts model routes each token to: replicas speaking SGLang's
	// protocol (sglang, managed) are asked for every completion's routed experts (routing replay;
	// the zero shape for a dense model asks none).
	Routes llm.RouteShape
}

// ErrUnavailable is wrapped by errors that mean no replica answered within the retries: the trainer
// checkpoints and stops (a run resumes with --resume once the engine is back).
var ErrUnavailable = errors.New("rollout engine unavailable")

// ReplyError is a malformed or partial reply: named, never a panic or an empty completion.
type ReplyError struct {
	URL    string
	Detail string
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("malformed reply from %s: %s", e.URL, e.Detail)
}

// StaleError says a replica does not serve the weights version it was told to load.
type StaleError struct {
	URL        string
	Want, Have string
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("replica %s serves weights version %q after a reload to %q: it did not reload (check that it can read the weights folder)", e.URL, e.Have, e.Want)
}

// Client generates through the replicas of one model's engine. It implements llm.Generator.
type Client struct {
	model string
	cfg   Config
	codec Codec
	proto protocol
	http  *http.Client
	reps  []*server

	mu       sync.Mutex
	cond     *sync.Cond
	next     int // round-robin start among equally loaded replicas
	pieces   map[string]int
	adapters map[string]string      // LoRA adapters loaded through LoadAdapter: name → folder
	routes   map[string]llm.Version // Route: request Model → the adapter version it runs on (its Adapter: the engine's name)
	// current is the weights version of the last Sync (unknown before it): only replicas serving it
	// take requests (one that took the next version early, ReloadIdle, waits for the Sync that makes
	// it current).
	current llm.Version
}

// New checks the configuration and connects to every replica (health check, served model name);
// an unreachable replica is an error naming its URL. model is the trained model's id (for messages).
func New(ctx context.Context, model string, cfg Config, codec Codec) (*Client, error) {
	proto, err := protocolFor(cfg.Engine)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", model, err)
	}
	if len(cfg.URLs) == 0 {
		return nil, fmt.Errorf("model %s: engine %s: no replica URLs", model, cfg.Engine)
	}
	if codec.Prompt == nil || codec.Tok == nil {
		return nil, fmt.Errorf("model %s: engine client needs the model's prompt encoder and tokenizer", model)
	}
	if _, ok := proto.(routesReturner); codec.Routes.MoE() && !ok {
		codec.Routes = llm.RouteShape{}
		log.Warn().Str("model", model).Str("engine", cfg.Engine).Msg("a mixture-of-experts model whose engine's replies carry no routed experts in drmas (sglang and managed do): its calls are trained with live routing, not replayed (algorithm.routing_replay; routing/* not written)")
	}
	cfg.MaxInflight = max(cfg.MaxInflight, 1)
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	c := &Client{model: model, cfg: cfg, codec: codec, proto: proto,
		http: &http.Client{Transport: bearer(cfg.APIKey, &http.Transport{MaxIdleConnsPerHost: cfg.MaxInflight, MaxConnsPerHost: cfg.MaxInflight + 4})}}
	c.cond = sync.NewCond(&c.mu)
	for _, u := range cfg.URLs {
		c.reps = append(c.reps, &server{url: strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/v1")})
	}
	if err := c.Check(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Check asks every replica whether it is up (and, for the OpenAI-style protocols, which model name
// it serves). It fails on the first replica that does not answer, naming its URL.
func (c *Client) Check(ctx context.Context) error {
	errs := c.eachReplica(ctx, min(c.cfg.Timeout, 30*time.Second), func(ctx context.Context, r *server) error {
		name, err := c.proto.check(ctx, c.http, r.url)
		if err != nil {
			return fmt.Errorf("model %s: %s replica %s is not reachable: %w", c.model, c.cfg.Engine, r.url, err)
		}
		r.served = name
		return nil
	})
	return errors.Join(errs...)
}

// eachReplica runs f on every replica at once, each under its own timeout, and returns their errors
// in replica order.
func (c *Client) eachReplica(ctx context.Context, timeout time.Duration, f func(context.Context, *server) error) []error {
	errs := make([]error, len(c.reps))
	var wg sync.WaitGroup
	for i, r := range c.reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			errs[i] = f(rctx, r)
		}()
	}
	wg.Wait()
	return errs
}

// Model is the trained model's id this client generates for.
func (c *Client) Model() string { return c.model }

// Engine is the protocol's name (sglang, vllm or openai).
func (c *Client) Engine() string { return c.cfg.Engine }

// URLs are the replicas' base URLs.
func (c *Client) URLs() []string {
	out := make([]string, len(c.reps))
	for i, r := range c.reps {
		out[i] = r.url
	}
	return out
}

// Generate encodes every request's prompt, sends all of them concurrently (up to MaxInflight per
// replica) and returns the completions aligned with reqs. The first request that fails on every
// attempt fails the call. A request whose Model is routed (Route) runs on its adapter, one whose
// Model names a LoRA adapter loaded with LoadAdapter on that one (as the policy's Generate does),
// any other on the base.
func (c *Client) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	prompts := make([][]int, len(reqs))
	var adapters []llm.Version
	c.mu.Lock()
	for i, r := range reqs {
		on, routed := c.routes[r.Model]
		if _, loaded := c.adapters[r.Model]; !routed && loaded {
			on = llm.Version{Adapter: r.Model}
		}
		if on.Adapter != "" {
			if adapters == nil {
				adapters = make([]llm.Version, len(reqs))
			}
			adapters[i] = on
		}
	}
	c.mu.Unlock()
	for i, r := range reqs {
		if len(r.Messages) == 0 && r.Text == "" {
			return nil, fmt.Errorf("model %s: request %d (agent %s): no messages", c.model, i, r.Agent)
		}
		ids, err := c.encode(r)
		if err != nil {
			return nil, fmt.Errorf("model %s: request %d (agent %s): %w", c.model, i, r.Agent, err)
		}
		if probs := r.Sampling.Check(); len(probs) > 0 {
			return nil, fmt.Errorf("model %s: request %d (agent %s): %w", c.model, i, r.Agent, probs[0])
		}
		prompts[i] = ids
	}
	return c.generateFitting(ctx, reqs, prompts, adapters)
}

// generateFitting generates the requests whose prompt is within its own bound
// (llm.Request.MaxPromptTokens); the others complete as overlong, nothing sent.
func (c *Client) generateFitting(ctx context.Context, reqs []llm.Request, prompts [][]int, adapters []llm.Version) ([]llm.Completion, error) {
	var keep []int
	for i, r := range reqs {
		if !r.Overlong(len(prompts[i])) {
			keep = append(keep, i)
		}
	}
	if len(keep) == len(reqs) {
		return c.generate(ctx, prompts, samplings(reqs), adapters)
	}
	out := make([]llm.Completion, len(reqs))
	for i := range reqs {
		out[i] = llm.Completion{PromptIDs: prompts[i], Finish: llm.FinishOverlong}
	}
	if len(keep) == 0 {
		return out, nil
	}
	ps, ss := make([][]int, len(keep)), make([]llm.Sampling, len(keep))
	var as []llm.Version
	for k, i := range keep {
		ps[k], ss[k] = prompts[i], reqs[i].Sampling
		if adapters != nil {
			as = append(as, adapters[i])
		}
	}
	gen, err := c.generate(ctx, ps, ss, as)
	if err != nil {
		return nil, err
	}
	for k, i := range keep {
		out[i] = gen[k]
	}
	return out, nil
}

func samplings(reqs []llm.Request) []llm.Sampling {
	out := make([]llm.Sampling, len(reqs))
	for i, r := range reqs {
		out[i] = r.Sampling
	}
	return out
}

// Route makes Generate run the requests whose Model is model on the adapter version v, loaded on
// the engine under v.Adapter (an unknown v ends the route: back to the base or the adapter named
// model); their completions carry v. A training routes each adapter's model id to its latest
// version (LoadAdapter under the new name, Route, then UnloadAdapter of the old one), so that
// requests switch versions between two generations.
func (c *Client) Route(model string, v llm.Version) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v.Adapter == "" {
		delete(c.routes, model)
		return
	}
	if c.routes == nil {
		c.routes = map[string]llm.Version{}
	}
	c.routes[model] = v
}

// GenerateIDs is Generate for prompts already given as token ids, on the base.
func (c *Client) GenerateIDs(ctx context.Context, prompts [][]int, settings []llm.Sampling) ([]llm.Completion, error) {
	return c.GenerateAdapterIDs(ctx, prompts, settings, nil)
}

// GenerateAdapterIDs is GenerateIDs with a LoRA adapter per prompt: adapters[i] names the adapter
// prompt i runs on ("" = the base; nil adapters: all on the base), sent as the request's model
// (vLLM, OpenAI) or lora_path (SGLang). The names are the engine's: loaded with LoadAdapter or
// given to the server at start-up.
func (c *Client) GenerateAdapterIDs(ctx context.Context, prompts [][]int, settings []llm.Sampling, adapters []string) ([]llm.Completion, error) {
	var on []llm.Version
	if adapters != nil {
		on = make([]llm.Version, len(adapters))
		for i, a := range adapters {
			on[i] = llm.Version{Adapter: a}
		}
	}
	return c.generate(ctx, prompts, settings, on)
}

// generate runs prompt i on the adapter version adapters[i] (on the base when its Adapter is "", or
// adapters is nil), its completion reporting that version (the replica's for the base).
func (c *Client) generate(ctx context.Context, prompts [][]int, settings []llm.Sampling, adapters []llm.Version) ([]llm.Completion, error) {
	if len(prompts) != len(settings) || (adapters != nil && len(adapters) != len(prompts)) {
		return nil, fmt.Errorf("model %s: %d prompts but %d sampling settings and %d adapters", c.model, len(prompts), len(settings), len(adapters))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]llm.Completion, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var adapter llm.Version
			if adapters != nil {
				adapter = adapters[i]
			}
			comp, err := c.one(ctx, prompts[i], settings[i], adapter)
			if err != nil {
				errs[i] = fmt.Errorf("model %s: request %d: %w", c.model, i, err)
				cancel() // one lost request fails the rollout: stop the others
				return
			}
			out[i] = comp
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// one sends a request, retrying on other replicas with backoff, and checks the reply.
func (c *Client) one(ctx context.Context, prompt []int, s llm.Sampling, adapter llm.Version) (llm.Completion, error) {
	var last error
	var tried []*server
	for attempt := 0; attempt <= c.cfg.Retries; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return llm.Completion{}, err
			}
		}
		r, err := c.acquire(ctx, tried)
		if err != nil {
			return llm.Completion{}, err
		}
		actx, cancel := context.WithTimeout(withReplyLimit(ctx, completionBound(len(prompt), s.MaxNewTokens)), c.cfg.Timeout)
		res, err := c.proto.generate(actx, c.http, r.url, genRequest{served: r.served, adapter: adapter.Adapter, prompt: prompt,
			sampling: s, stopIDs: c.codec.StopIDs, pieces: c.pieceID, routes: c.codec.Routes})
		cancel()
		if err == nil {
			err = c.check(r.url, res, s)
		}
		c.release(r, err)
		if err == nil {
			comp := c.completion(prompt, res)
			comp.Replica, comp.Version = r.url, adapter
			if adapter.Adapter == "" {
				c.mu.Lock()
				comp.Version = r.version
				c.mu.Unlock()
			}
			return comp, nil
		}
		if ctx.Err() != nil {
			return llm.Completion{}, ctx.Err()
		}
		var bad *badRequestError
		if errors.As(err, &bad) { // the request itself is wrong: no other replica will take it
			return llm.Completion{}, err
		}
		last = fmt.Errorf("replica %s: %w", r.url, err)
		tried = append(tried, r)
	}
	return llm.Completion{}, fmt.Errorf("%w: model %s: no replica of %s answered in %d attempts (timeout %s each); last error: %v",
		ErrUnavailable, c.model, strings.Join(c.URLs(), ", "), c.cfg.Retries+1, c.cfg.Timeout, last)
}

// completion turns a checked reply into the seam's Completion, decoding the text with our tokenizer
// exactly as local generation does (the final stop token is not part of Text).
func (c *Client) completion(prompt []int, res result) llm.Completion {
	text := res.ids
	if n := len(text); n > 0 && c.isStop(text[n-1]) {
		text = text[:n-1]
	}
	finish := res.finish
	if c.isStop(res.ids[len(res.ids)-1]) {
		finish = llm.FinishStop // as local generation reports a stop token sampled at the length limit
	}
	return llm.Completion{Text: c.codec.Tok.Decode(text), PromptIDs: prompt, ResponseIDs: res.ids, LogProbs: res.logps, Finish: finish, Routes: res.routes}
}

// TokenPiece is how OpenAI-style completions write one token in logprobs.tokens: its text, or
// "bytes:\xNN..." when its bytes are not valid UTF-8 on their own (part of a character).
func TokenPiece(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.WriteString("bytes:")
	for _, x := range b {
		fmt.Fprintf(&sb, "\\x%02x", x)
	}
	return sb.String()
}

// pieceID maps a token's piece (as plain OpenAI servers return it, see TokenPiece) to its id, kept
// only where exactly one id has that piece.
func (c *Client) pieceID(piece string) (int, bool) {
	c.mu.Lock()
	if c.pieces == nil {
		c.pieces = map[string]int{}
		for id := 0; id < c.codec.Tok.VocabSize(); id++ {
			p := TokenPiece(c.codec.Tok.DecodeBytes([]int{id}))
			if _, dup := c.pieces[p]; dup {
				c.pieces[p] = -1
			} else {
				c.pieces[p] = id
			}
		}
	}
	id, ok := c.pieces[piece]
	c.mu.Unlock()
	return id, ok && id >= 0
}

func (c *Client) isStop(id int) bool {
	for _, s := range c.codec.StopIDs {
		if s == id {
			return true
		}
	}
	return false
}

func backoff(attempt int) time.Duration {
	d := 100 * time.Millisecond << min(attempt-1, 6)
	return min(d, 5*time.Second)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// encode is a request's prompt ids: its raw Text tokenized as it is, or its messages through the
// model's chat template (as the local policy does).
func (c *Client) encode(r llm.Request) ([]int, error) {
	if r.Text != "" {
		return c.codec.Tok.Encode(r.Text), nil
	}
	return c.codec.Prompt(r.Messages, r.ChatTemplateKwargs)
}
