package policy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// row is one completion being generated.
type row struct {
	prompt   []int
	sampling llm.Sampling
	resp     []int
	logps    []float32
	text     []byte // the bytes of resp, for stop strings
	done     bool
	finish   llm.Finish
	opt      RowOptions
	adapter  *Adapter                    // nil: the base alone
	routes   []int16                     // the experts of its tokens fed so far, when RowOptions.Record is set
	rng      *rand.Rand                  // the row's uniform numbers (rowStream), from when it starts
	end      func(llm.Completion, error) // GenerateJobs: hands the row's result over
}

// TopLogProb is one of the most likely tokens at a generated position, with its log-prob under the
// distribution the token was sampled from (log-softmax(logits / T), T = 1 for greedy rows).
type TopLogProb struct {
	ID      int
	LogProb float32
}

// Token is one sampled token as generation hands it out.
type Token struct {
	ID      int
	LogProb float32
	Top     []TopLogProb // the RowOptions.TopLogProbs most likely tokens, most likely first; nil when none asked
}

// MaxTopLogProbs is the most alternatives per token a row may ask for (OpenAI's limit).
const MaxTopLogProbs = 20

// RowOptions are the per-row extras of GenerateStream: a server streams tokens as they are sampled,
// returns alternatives, and drops a row whose client left.
type RowOptions struct {
	// Ctx ends the row (Finish llm.FinishAbort) at the next step once done; nil: never. The other rows
	// of the batch go on.
	Ctx context.Context
	// TopLogProbs is how many of the most likely tokens each Token carries (0 – MaxTopLogProbs).
	TopLogProbs int
	// OnToken is called with every token of the row, in order, as it is sampled: on the torch thread,
	// so it must return at once (hand the token to a buffered channel).
	OnToken func(Token)
	// Adapter names an adapter registered with AddAdapter that the row runs on; "": the policy's
	// model as it is (its adapter, for an adapted policy).
	Adapter string

	// For a mixture-of-experts model only (routing.go; a bad request on a dense one):
	//
	// Record, when set, receives the experts the row's tokens were routed to once the row ends
	// (before its completion is handed out): the prompt's and every response token's but the last,
	// which no forward sees, in vLLM's routed_experts layout (Routes.From 0).
	Record *Routes
	// Replay, when set, routes the row's tokens it covers to its experts (prefill and decoding
	// alike), the gate weights from the live router's probabilities.
	Replay *Routes
}

// checkRoutes refuses routes asked of a dense model and Replay routes that are not the model's or
// cover more than the prompt and max_new tokens.
func (o RowOptions) checkRoutes(m *Model, prompt, maxNew int) error {
	if o.Record != nil && !m.isMoE() {
		return errors.New("routes to record, but the model has no mixture-of-experts layers")
	}
	if o.Replay != nil {
		if err := m.checkRoutes(o.Replay, prompt+maxNew); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
	}
	return nil
}

// Generate renders each request's messages with the chat template (with the assistant generation
// prompt), tokenizes them and generates the completions with continuous batching (see continuous.go):
// at most MaxBatch rows in flight, left-padded and prefilled together, then one token per step for
// every row with a preallocated KV cache, a finished row's slot taken by the next waiting row. Each row
// stops at its first stop token (an end-of-turn token or EOS, kept as the last of ResponseIDs, as
// training data keeps EOS), at the token whose decoded text completes one of its Sampling.Stop
// strings (anywhere in that token: kept in the text and the ids), or after Sampling.MaxNewTokens tokens. Text is the decoded
// ResponseIDs without a final stop token. LogProbs are log-softmax(logits / T) at the chosen tokens
// (T = 1 for greedy rows), before top-k / top-p filtering; the trainer recomputes exact ones with
// Score. Sampling is seeded per request (see sampler): a request's tokens depend on its own seed and
// prompt, not on the rest of the batch (up to floating-point noise of batched matmuls).
//
// Generate runs its torch work on the torch thread itself (torch.Do), so it can be called from any
// goroutine, but not from inside torch.Do.
func (p *Policy) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	prompts := make([][]int, len(reqs))
	settings := make([]llm.Sampling, len(reqs))
	var opts []RowOptions
	if p.Model.isMoE() { // every completion carries its routes (llm.Completion.Routes)
		opts = make([]RowOptions, len(reqs))
		for i := range opts {
			opts[i].Record = new(Routes)
		}
	}
	for i, r := range reqs {
		if r.Model != "" && r.Model != p.ID && p.LookupAdapter(r.Model) != nil {
			if opts == nil {
				opts = make([]RowOptions, len(reqs))
			}
			opts[i].Adapter = r.Model
		}
		ids, err := p.encodeRequest(r)
		if err != nil {
			return nil, fmt.Errorf("request %d (agent %s): %w", i, r.Agent, err)
		}
		prompts[i] = ids
		settings[i] = r.Sampling
	}
	fit := p.fitContext(reqs, prompts, settings)
	if fit == nil {
		return p.GenerateStream(ctx, prompts, settings, opts)
	}
	// Requests whose prompt leaves no room complete as overlong; the others are generated.
	var keep []int
	var ps [][]int
	var ss []llm.Sampling
	var ros []RowOptions
	for i := range reqs {
		if fit[i] {
			continue
		}
		keep = append(keep, i)
		ps, ss = append(ps, prompts[i]), append(ss, settings[i])
		if opts != nil {
			ros = append(ros, opts[i])
		}
	}
	var gen []llm.Completion
	if len(keep) > 0 {
		var err error
		if gen, err = p.GenerateStream(ctx, ps, ss, ros); err != nil {
			return nil, err
		}
	}
	out := make([]llm.Completion, len(reqs))
	for i := range reqs {
		if fit[i] {
			out[i] = llm.Completion{PromptIDs: prompts[i], Finish: llm.FinishOverlong}
		}
	}
	for k, i := range keep {
		out[i] = gen[k]
	}
	return out, nil
}

// fitContext applies Request.FitContext: each such request's max_new_tokens is cut to the room its
// prompt leaves in max_position_embeddings, and the requests whose prompt leaves none are marked
// (nil when there are none).
func (p *Policy) fitContext(reqs []llm.Request, prompts [][]int, settings []llm.Sampling) []bool {
	limit := p.Model.Config.MaxPositionEmbeddings
	var overlong []bool
	for i, r := range reqs {
		over := r.Overlong(len(prompts[i]))
		if !over && (!r.FitContext || limit <= 0 || len(prompts[i])+settings[i].MaxNewTokens <= limit) {
			continue
		}
		if room := limit - len(prompts[i]); room > 0 && !over {
			settings[i].MaxNewTokens = room
			continue
		}
		if overlong == nil {
			overlong = make([]bool, len(reqs))
		}
		overlong[i] = true
	}
	return overlong
}

// GenerateIDs generates completions of prompts given as token ids (no chat template), one sampling
// setting per prompt; otherwise as Generate. It enters torch.Do itself.
func (p *Policy) GenerateIDs(ctx context.Context, prompts [][]int, settings []llm.Sampling) ([]llm.Completion, error) {
	return p.GenerateStream(ctx, prompts, settings, nil)
}

// GenerateStream is GenerateIDs with per-row options (nil, or one per prompt): tokens handed out as
// they are sampled, top log-probs, and rows that end early when their own context does.
//
// Rows may run on different adapters of the policy's base (RowOptions.Adapter): they share batches,
// each row's low-rank terms computed from its own adapter (multi-LoRA batching).
func (p *Policy) GenerateStream(ctx context.Context, prompts [][]int, settings []llm.Sampling, opts []RowOptions) ([]llm.Completion, error) {
	adapters := make([]*Adapter, len(prompts))
	for i := range adapters {
		adapters[i] = p.Model.Adapter()
		if opts != nil && i < len(opts) && opts[i].Adapter != "" {
			if adapters[i] = p.LookupAdapter(opts[i].Adapter); adapters[i] == nil {
				return nil, fmt.Errorf("policy %s: request %d: %w: no adapter %q", p.ID, i, llm.ErrBadRequest, opts[i].Adapter)
			}
		}
	}
	return p.generate(ctx, prompts, settings, opts, adapters)
}

// generate is GenerateStream with each row's adapter given (nil: the base alone).
func (p *Policy) generate(ctx context.Context, prompts [][]int, settings []llm.Sampling, opts []RowOptions, adapters []*Adapter) ([]llm.Completion, error) {
	if len(prompts) != len(settings) || (opts != nil && len(opts) != len(prompts)) {
		return nil, fmt.Errorf("policy %s: %d prompts but %d sampling settings and %d row options", p.ID, len(prompts), len(settings), len(opts))
	}
	rows := make([]*row, len(prompts))
	for i := range prompts {
		if err := p.checkRequest(prompts[i], settings[i]); err != nil {
			return nil, fmt.Errorf("policy %s: request %d: %w: %w", p.ID, i, llm.ErrBadRequest, err)
		}
		rows[i] = &row{prompt: prompts[i], sampling: settings[i], adapter: adapters[i]}
		if opts != nil {
			if n := opts[i].TopLogProbs; n < 0 || n > MaxTopLogProbs {
				return nil, fmt.Errorf("policy %s: request %d: %w: top log-probs %d: want 0–%d", p.ID, i, llm.ErrBadRequest, n, MaxTopLogProbs)
			}
			if err := opts[i].checkRoutes(p.Model, len(prompts[i]), settings[i].MaxNewTokens); err != nil {
				return nil, fmt.Errorf("policy %s: request %d: %w: %w", p.ID, i, llm.ErrBadRequest, err)
			}
			rows[i].opt = opts[i]
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	err := torch.Do(func() error {
		return torch.NoGrad(func() error { return p.runRows(ctx, rows) })
	})
	torch.ReleaseMemory()
	if err != nil {
		return nil, err
	}
	out := make([]llm.Completion, len(rows))
	for i, r := range rows {
		out[i] = p.completion(r)
	}
	return out, nil
}

// runRows generates rows, shortest prompts first (rows of similar length share a batch, so that
// little is padded): with continuous batching, MaxBatch rows in flight, a finished row's slot
// taken by the next waiting row; with StaticBatching, in batches of MaxBatch rows, each run to its
// end before the next starts. On the torch thread, gradients off.
func (p *Policy) runRows(ctx context.Context, rows []*row) error {
	order := slices.Clone(rows)
	slices.SortStableFunc(order, func(a, b *row) int { return cmp.Compare(len(a.prompt), len(b.prompt)) })
	scope := torch.NewScope()
	defer scope.Close()
	dm := p.decodingModel(p.Model.Base())
	if !p.StaticBatching {
		src := rowList(order)
		return p.newEngine(ctx, dm).run(&src)
	}
	size := p.MaxBatch
	if size <= 0 {
		size = len(order)
	}
	for start := 0; start < len(order); start += size {
		src := rowList(order[start:min(start+size, len(order))])
		if err := p.newEngine(ctx, dm).run(&src); err != nil {
			return err
		}
	}
	return nil
}

// newEngine is an engine of the policy's limits decoding with dm.
func (p *Policy) newEngine(ctx context.Context, dm *Model) *engine {
	return &engine{p: p, ctx: ctx, dm: dm, m: dm, maxRows: p.MaxBatch, budget: p.KVTokens}
}

// completion is r's result: Text is its response without a final stop token, decoded.
func (p *Policy) completion(r *row) llm.Completion {
	text := r.resp
	if n := len(text); n > 0 && p.isStop(text[n-1]) {
		text = text[:n-1]
	}
	var decoded string
	if p.Tok != nil {
		decoded = p.Tok.Decode(text)
	}
	return llm.Completion{Text: decoded, PromptIDs: r.prompt, ResponseIDs: r.resp, LogProbs: r.logps, Finish: r.finish, Routes: r.opt.Record}
}

func (p *Policy) checkRequest(prompt []int, s llm.Sampling) error {
	var errs []error
	if len(prompt) == 0 {
		errs = append(errs, errors.New("empty prompt"))
	}
	for _, id := range prompt {
		if id < 0 || id >= p.Model.Config.VocabSize {
			errs = append(errs, fmt.Errorf("prompt token id %d outside the vocabulary [0, %d)", id, p.Model.Config.VocabSize))
			break
		}
	}
	for _, pr := range s.Check() {
		errs = append(errs, pr)
	}
	if n, limit := len(prompt)+s.MaxNewTokens, p.Model.Config.MaxPositionEmbeddings; limit > 0 && n > limit {
		errs = append(errs, fmt.Errorf("prompt of %d tokens + max_new_tokens %d = %d exceeds the model's max_position_embeddings %d",
			len(prompt), s.MaxNewTokens, n, limit))
	}
	return errors.Join(errs...)
}

func (p *Policy) isStop(id int) bool { return slices.Contains(p.StopIDs, id) }

// record appends a generated token to r, hands it to the row's OnToken and decides whether r is
// finished. A stop string is matched anywhere in the decoded text that the token completes, so one
// that ends inside a multi-character token (stop "}" and a token "})") stops too.
func (p *Policy) record(r *row, id int, logp float32, top []TopLogProb) {
	r.resp = append(r.resp, id)
	r.logps = append(r.logps, logp)
	if r.opt.OnToken != nil {
		r.opt.OnToken(Token{ID: id, LogProb: logp, Top: top})
	}
	if p.isStop(id) {
		r.done, r.finish = true, llm.FinishStop
		return
	}
	if len(r.sampling.Stop) > 0 && p.Tok != nil {
		before := len(r.text)
		r.text = append(r.text, p.Tok.DecodeBytes([]int{id})...)
		for _, s := range r.sampling.Stop {
			if s != "" && bytes.Contains(r.text[max(0, before-len(s)+1):], []byte(s)) {
				r.done, r.finish = true, llm.FinishStop
				return
			}
		}
	}
	if len(r.resp) >= r.sampling.MaxNewTokens {
		r.done, r.finish = true, llm.FinishLength
	}
}

// fetchTop copies the top log-probs [B, k] and their ids to the host: nil when there are none.
func fetchTop(lp, ids *ts.Tensor) [][]TopLogProb {
	if lp == nil {
		return nil
	}
	size := lp.MustSize()
	B, k := int(size[0]), int(size[1])
	vals := make([]float64, B*k)
	torch.MustRead(lp.MustTotype(gotch.Double, false), vals)
	idv := make([]int64, B*k)
	torch.MustRead(ids, idv)
	out := make([][]TopLogProb, B)
	for b := range out {
		out[b] = make([]TopLogProb, k)
		for j := range out[b] {
			out[b][j] = TopLogProb{ID: int(idv[b*k+j]), LogProb: float32(vals[b*k+j])}
		}
	}
	return out
}

// fetch copies the chosen ids and log-probs to the host in one transfer.
func fetch(tok, lp *ts.Tensor) ([]int, []float32) {
	B := tok.MustSize()[0]
	packed := ts.MustStack([]*ts.Tensor{tok.MustTotype(gotch.Double, false), lp.MustTotype(gotch.Double, false)}, 1)
	vals := make([]float64, 2*B)
	torch.MustRead(packed, vals)
	ids := make([]int, B)
	lps := make([]float32, B)
	for b := range ids {
		ids[b] = int(vals[2*b])
		lps[b] = float32(vals[2*b+1])
	}
	return ids, lps
}

// encodeRequest is a request's prompt ids: its raw Text tokenized as it is, or its messages through
// the chat template.
func (p *Policy) encodeRequest(r llm.Request) ([]int, error) {
	if r.Text != "" {
		return p.Tok.Encode(r.Text), nil
	}
	if len(r.Messages) == 0 {
		return nil, fmt.Errorf("policy %s: no messages", p.ID)
	}
	return p.EncodePromptWith(r.Messages, r.ChatTemplateKwargs)
}
