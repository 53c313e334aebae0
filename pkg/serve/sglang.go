package serve

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
)

// samplingParams are the request settings drmas serve honours, in SGLang's names (the OpenAI
// handlers fill them from theirs).
type samplingParams struct {
	MaxNewTokens *int   `json:"max_new_tokens"`
	SamplingSeed *int64 `json:"sampling_seed"`
	NoStopTrim   bool   `json:"no_stop_trim"`
	commonParams
	unsupportedParams
	// maxName is the field MaxNewTokens came from on the OpenAI endpoints (max_tokens or
	// max_completion_tokens), for errors; "" on /generate.
	maxName string
}

// commonParams are the settings drmas serve honours that SGLang's sampling_params and the OpenAI
// endpoints' bodies (with vLLM's extras) name alike.
type commonParams struct {
	Temperature  *float64    `json:"temperature"`
	TopP         *float64    `json:"top_p"`
	TopK         *int        `json:"top_k"`
	Stop         stringOrSet `json:"stop"`
	StopTokenIDs []int       `json:"stop_token_ids"`
	N            *int        `json:"n"`
	// SkipSpecialTokens false keeps special tokens in the text.
	SkipSpecialTokens *bool `json:"skip_special_tokens"`
}

// keepSpecial says whether the text keeps special tokens (skip_special_tokens: false).
func (p commonParams) keepSpecial() bool { return p.SkipSpecialTokens != nil && !*p.SkipSpecialTokens }

// stringOrSet decodes "stop": a string or a list of strings.
type stringOrSet []string

func (s *stringOrSet) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("stop: want a string or a list of strings")
	}
	*s = many
	return nil
}

// toSampling checks the settings and turns them into the policy's, with defaultMax new tokens when
// none is asked; a request without a seed gets a random one.
func (s *Server) toSampling(p samplingParams, defaultMax int) (llm.Sampling, error) {
	out := llm.Sampling{MaxNewTokens: defaultMax, Temperature: 1, Stop: p.Stop}
	if p.MaxNewTokens != nil {
		out.MaxNewTokens = *p.MaxNewTokens
	}
	if p.Temperature != nil {
		out.Temperature = *p.Temperature
	}
	if p.TopP != nil {
		out.TopP = *p.TopP
	}
	if p.TopK != nil {
		// vLLM and SGLang take -1 (and 0) for no top-k; anything below is a mistake, not "off".
		if *p.TopK < -1 {
			return out, badRequest("top_k", "top_k %d: want ≥ 1, or 0 or -1 for no top-k", *p.TopK)
		}
		out.TopK = max(*p.TopK, 0)
	}
	if p.SamplingSeed != nil {
		out.Seed = *p.SamplingSeed
	} else {
		out.Seed = rand.Int64()
	}
	if probs := out.Check(); len(probs) > 0 {
		key, msg := probs[0].Key, probs[0].Error()
		if key == "max_new_tokens" && p.maxName != "" { // the name the request used
			key, msg = p.maxName, p.maxName+strings.TrimPrefix(msg, "max_new_tokens")
		}
		return out, badRequest(key, "%s", msg)
	}
	for _, id := range p.StopTokenIDs {
		if !slices.Contains(s.pol.StopIDs, id) {
			return out, badRequest("stop_token_ids", "stop_token_ids: %d is not one of the model's stop tokens %v (drmas serve stops at those and at stop strings)", id, s.pol.StopIDs)
		}
	}
	return out, nil
}

// checkPrompt rejects token ids outside the vocabulary and prompts that do not fit the model.
func (s *Server) checkPrompt(ids []int, maxNew int) error {
	if len(ids) == 0 {
		return badRequest("prompt", "empty prompt")
	}
	s.mu.Lock() // a reload may change the configuration (Server.load)
	vocab, maxPos := s.pol.Model.Config.VocabSize, s.pol.Model.Config.MaxPositionEmbeddings
	s.mu.Unlock()
	for _, id := range ids {
		if id < 0 || id >= vocab {
			return badRequest("prompt", "prompt token id %d outside the vocabulary [0, %d)", id, vocab)
		}
	}
	if limit := maxPos; limit > 0 && len(ids)+maxNew > limit {
		return badRequest("prompt", "prompt of %d tokens + %d new tokens exceeds the model's %d positions", len(ids), maxNew, limit)
	}
	return nil
}

// precheck refuses a prompt text of size bytes that cannot fit the model with maxNew new tokens,
// before it is tokenized (tokenizing a long text costs time and many times its size in memory): a
// token stands for at most maxTokenBytes bytes (the vocabulary's longest), and normalization shrinks
// text at most threefold, so such a text has at least size / (3·maxTokenBytes) tokens.
func (s *Server) precheck(param string, size, maxNew int) error {
	s.mu.Lock()
	maxPos := s.pol.Model.Config.MaxPositionEmbeddings
	s.mu.Unlock()
	if maxPos <= 0 || s.maxTokenBytes <= 0 {
		return nil
	}
	if least := size / (3 * s.maxTokenBytes); least > 0 && least+max(maxNew, 0) > maxPos {
		return badRequest(param, "%s: %d bytes of text are at least %d tokens (a token is at most %d bytes), which with %d new tokens exceeds the model's %d positions",
			param, size, least, 3*s.maxTokenBytes, maxNew, maxPos)
	}
	return nil
}

// generateRequest is the body of SGLang's POST /generate.
type generateRequest struct {
	Text           *string         `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams samplingParams  `json:"sampling_params"`
	ReturnLogprob  bool            `json:"return_logprob"`
	TopLogprobsNum int             `json:"top_logprobs_num"`
	Stream         bool            `json:"stream"`
	Rid            string          `json:"rid"`
	LoraPath       json.RawMessage `json:"lora_path"`
	// ReturnRoutedExperts asks a mixture-of-experts model's routed experts (SGLang's
	// meta_info.routed_experts: base64 int32, [prompt + response − 1 tokens, layers, top-k]).
	ReturnRoutedExperts bool `json:"return_routed_experts"`
}

// generate is SGLang's native POST /generate for one prompt (text or input_ids), answered in one
// reply or, with "stream": true, as server-sent events whose text and output_ids grow with every
// token (SGLang's default, non-incremental stream) and end with "data: [DONE]".
func (s *Server) generate(w http.ResponseWriter, r *http.Request) {
	var req generateRequest
	release, ok := s.readJSON(w, r, &req)
	if !ok {
		return
	}
	defer release()
	lora, err := s.sglangLoRA(req.LoraPath)
	if err != nil {
		writeError(w, err)
		return
	}
	defer s.releaseLoRA(lora)
	if err := req.check(); err != nil {
		writeError(w, err)
		return
	}
	sp, err := s.toSampling(req.SamplingParams, 128)
	if err != nil {
		writeError(w, err)
		return
	}
	prompt, err := s.generatePrompt(&req, sp.MaxNewTokens)
	if err != nil {
		writeError(w, err)
		return
	}
	top := 0
	if req.ReturnLogprob {
		top = req.TopLogprobsNum
	}
	topt := textOptions{stops: sp.Stop, keepStop: req.SamplingParams.NoStopTrim, keepSpecial: req.SamplingParams.keepSpecial()}
	s.mu.Lock() // a reload may change the model (Server.load)
	moe := s.pol.Model.RouteShape().MoE()
	s.mu.Unlock()
	if req.ReturnRoutedExperts && !moe {
		writeError(w, badRequest("return_routed_experts", "return_routed_experts: the model has no mixture-of-experts layers"))
		return
	}
	choices := []choice{{prompt: prompt, sampling: sp, top: top, lora: lora, routes: req.ReturnRoutedExperts}}
	if !req.Stream {
		res, err := s.collect(r, choices, topt, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, s.generateReply(&req, prompt, top, res, true))
		return
	}
	ev := startSSE(w)
	_, err = s.collect(r, choices, topt, func(res *result, _ []int, ended map[int]bool) error {
		return ev.send(s.generateReply(&req, prompt, top, res, ended[0]))
	})
	if err != nil {
		ev.fail(err)
		return
	}
	ev.done()
}

// check refuses what /generate does not do before anything runs: n other than 1, a sampling setting
// the sampler does not implement, top_logprobs_num out of range.
func (req *generateRequest) check() error {
	if n := req.SamplingParams.N; n != nil && *n != 1 {
		return badRequest("sampling_params.n", "sampling_params.n %d: /generate returns one completion per request (send the prompt again with another sampling_seed, or use /v1/completions with n)", *n)
	}
	if err := req.SamplingParams.unsupportedParams.check("sampling_params.", 1); err != nil {
		return err
	}
	if req.TopLogprobsNum < 0 || req.TopLogprobsNum > policy.MaxTopLogProbs {
		return badRequest("top_logprobs_num", "top_logprobs_num %d: want 0–%d", req.TopLogprobsNum, policy.MaxTopLogProbs)
	}
	return nil
}

// generatePrompt is the request's prompt as token ids: input_ids as given, or text tokenized (after
// the precheck that it can fit with maxNew new tokens); either way checked against the model.
func (s *Server) generatePrompt(req *generateRequest, maxNew int) ([]int, error) {
	var prompt []int
	switch {
	case req.InputIDs != nil && req.Text != nil:
		return nil, badRequest("input_ids", "give either text or input_ids, not both")
	case req.InputIDs != nil:
		if err := json.Unmarshal(req.InputIDs, &prompt); err != nil {
			return nil, badRequest("input_ids", "input_ids: want one list of token ids (drmas serve takes one prompt per request; send several requests at once, it batches them)")
		}
	case req.Text != nil:
		if err := s.precheck("text", len(*req.Text), maxNew); err != nil {
			return nil, err
		}
		prompt = s.pol.Tok.Encode(*req.Text)
	default:
		return nil, badRequest("text", "text or input_ids is required")
	}
	if err := s.checkPrompt(prompt, maxNew); err != nil {
		return nil, err
	}
	return prompt, nil
}

// generateReply is /generate's answer for the choice so far (the whole reply, or one streamed event):
// the text (while streaming, only what can no longer change), the output ids and meta_info, whose
// finish_reason is set once final.
func (s *Server) generateReply(req *generateRequest, prompt []int, top int, res *result, final bool) map[string]any {
	t := res.texts[0]
	s.mu.Lock()
	version := s.version
	s.mu.Unlock()
	meta := map[string]any{"id": req.Rid, "finish_reason": nil, "prompt_tokens": len(prompt),
		"completion_tokens": len(t.toks), "cached_tokens": 0, "weight_version": version}
	if final {
		meta["finish_reason"] = s.sglangFinish(res.comps[0], t)
		if r := res.comps[0].Routes; req.ReturnRoutedExperts && r != nil {
			meta["routed_experts"] = r.Base64()
		}
	}
	if req.ReturnLogprob {
		lps, tops := sglangLogprobs(t.toks, top)
		meta["output_token_logprobs"] = lps
		if top > 0 {
			meta["output_top_logprobs"] = tops
		}
	}
	var text string
	if final {
		text = t.text()
	} else {
		text = t.tok.Text(t.raw[:t.safe()])
	}
	return map[string]any{"text": text, "output_ids": t.ids(), "meta_info": meta}
}

// sglangFinish is SGLang's finish_reason object: the type, and for a stop what matched (the stop
// token's id, or the stop string).
func (s *Server) sglangFinish(c llm.Completion, t *choiceText) map[string]any {
	finish := map[string]any{"type": finishReason(c.Finish)}
	if last := t.toks[len(t.toks)-1].ID; c.Finish == llm.FinishStop && slices.Contains(s.pol.StopIDs, last) {
		finish["matched"] = last
	} else if c.Finish == llm.FinishStop {
		finish["matched"] = t.matched
	}
	return finish
}

// sglangLoRA resolves /generate's lora_path: the name of a loaded adapter (recent SGLang takes the
// name there), a list of one name (SGLang aligns a list with a batch of prompts; drmas serve takes
// one prompt per request), or null / "" for the base. The adapter is returned with one user held.
func (s *Server) sglangLoRA(raw json.RawMessage) (*served, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var name *string
	if err := json.Unmarshal(raw, &name); err != nil {
		var names []*string
		if json.Unmarshal(raw, &names) != nil {
			return nil, badRequest("lora_path", "lora_path: want an adapter name, a list of one, or null")
		}
		if len(names) != 1 {
			return nil, badRequest("lora_path", "lora_path: a list of %d names, but drmas serve takes one prompt per /generate request (send one request per prompt; they are batched together)", len(names))
		}
		name = names[0]
	}
	if name == nil || *name == "" {
		return nil, nil
	}
	sv, err := s.useModel(*name)
	if err != nil {
		return nil, badRequest("lora_path", "lora_path %q: no LoRA adapter of that name is loaded (POST /load_lora_adapter first); %v", *name, err)
	}
	return sv, nil
}
