package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
)

// Bounds on what one OpenAI request may ask for.
const (
	maxN       = 128 // OpenAI's limit on n
	maxChoices = 256 // prompts × n in one request
)

// openaiParams are the OpenAI sampling fields (plus vLLM's extras) both endpoints take.
type openaiParams struct {
	Model               string         `json:"model"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Temperature         *float64       `json:"temperature"`
	TopP                *float64       `json:"top_p"`
	TopK                *int           `json:"top_k"`
	Seed                *int64         `json:"seed"`
	Stop                stringOrSet    `json:"stop"`
	StopTokenIDs        []int          `json:"stop_token_ids"`
	N                   *int           `json:"n"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	// vLLM's: write logprobs.tokens as "token_id:N"; add choices[].token_ids; keep stop strings;
	// keep special tokens in the text
	ReturnTokensAsTokenIDs bool  `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool  `json:"return_token_ids"`
	IncludeStopStrInOutput bool  `json:"include_stop_str_in_output"`
	SkipSpecialTokens      *bool `json:"skip_special_tokens"`
	unsupportedParams
}

func (p openaiParams) sampling() samplingParams {
	limit := p.MaxTokens
	if p.MaxCompletionTokens != nil {
		limit = p.MaxCompletionTokens
	}
	return samplingParams{MaxNewTokens: limit, Temperature: p.Temperature, TopP: p.TopP, TopK: p.TopK, Stop: p.Stop,
		StopTokenIDs: p.StopTokenIDs, SamplingSeed: p.Seed}
}

func (p openaiParams) textOptions() textOptions {
	return textOptions{stops: p.Stop, keepStop: p.IncludeStopStrInOutput, keepSpecial: p.SkipSpecialTokens != nil && !*p.SkipSpecialTokens}
}

// choicesFor checks the settings and makes n choices of every prompt (on adapter lora, nil: the
// base): choice k of a prompt samples
// with seed+k (vLLM's n), the seed random when none is given.
func (s *Server) choicesFor(p openaiParams, prompts [][]int, defaultMax, top int, lora *served) ([]choice, error) {
	n := 1
	if p.N != nil {
		n = *p.N
	}
	if n < 1 || n > maxN {
		return nil, badRequest("n", "n %d: want 1–%d", n, maxN)
	}
	if len(prompts)*n > maxChoices {
		return nil, badRequest("n", "%d prompts × n %d = %d completions: at most %d per request", len(prompts), n, len(prompts)*n, maxChoices)
	}
	if err := p.unsupportedParams.check("", n); err != nil {
		return nil, err
	}
	sp, err := s.toSampling(p.sampling(), defaultMax)
	if err != nil {
		return nil, err
	}
	var out []choice
	for i, prompt := range prompts {
		if err := s.checkPrompt(prompt, sp.MaxNewTokens); err != nil {
			if len(prompts) > 1 {
				err.(*apiError).msg = fmt.Sprintf("prompt %d: %s", i, err.(*apiError).msg)
			}
			return nil, err
		}
		for k := 0; k < n; k++ {
			c := choice{prompt: prompt, sampling: sp, top: top, lora: lora}
			c.sampling.Seed = sp.Seed + int64(k)
			out = append(out, c)
		}
	}
	return out, nil
}

// result is a request's choices as they arrive.
type result struct {
	texts  []*choiceText
	comps  []llm.Completion
	ended  []bool
	sentLP []int // tokens whose log-probs were streamed, per choice
}

// collect runs choices and follows their tokens until every one has ended; each time events arrive
// it calls step (nil: none) with the choices they touched, in order, and which of them ended.
func (s *Server) collect(r *http.Request, choices []choice, topt textOptions, step func(res *result, touched []int, ended map[int]bool) error) (*result, error) {
	res := &result{texts: make([]*choiceText, len(choices)), comps: make([]llm.Completion, len(choices)),
		ended: make([]bool, len(choices)), sentLP: make([]int, len(choices))}
	for i := range choices {
		res.texts[i] = newChoiceText(s.pol.Tok, s.pol.StopIDs, topt)
	}
	st, err := s.start(r.Context(), choices)
	if err != nil {
		return nil, err
	}
	left := len(choices)
	for left > 0 {
		evs, err := st.next(r.Context())
		if err != nil {
			return nil, err
		}
		var touched []int
		ended := map[int]bool{}
		seen := map[int]bool{}
		for _, e := range evs {
			if !seen[e.choice] {
				seen[e.choice] = true
				touched = append(touched, e.choice)
			}
			if !e.end {
				res.texts[e.choice].add(e.tok)
				continue
			}
			if e.err != nil {
				if errors.Is(e.err, llm.ErrBadRequest) {
					return nil, badRequest("", "%v", e.err)
				}
				return nil, e.err
			}
			res.comps[e.choice], res.ended[e.choice] = e.comp, true
			ended[e.choice] = true
			left--
		}
		if step != nil {
			slices.Sort(touched)
			if err := step(res, touched, ended); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

// usage counts each prompt once and every choice's tokens.
func usage(prompts [][]int, res *result) map[string]int {
	p, c := 0, 0
	for _, pr := range prompts {
		p += len(pr)
	}
	for _, t := range res.texts {
		c += len(t.toks)
	}
	return map[string]int{"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
}

// sse writes server-sent events.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w)}
}

func (e *sse) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// A client that stops reading is dropped (its row ends) instead of holding the handler.
	_ = e.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := fmt.Fprintf(e.w, "data: %s\n\n", b); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (e *sse) done() {
	fmt.Fprint(e.w, "data: [DONE]\n\n")
	_ = e.rc.Flush()
}

// fail ends a stream whose status line has gone: the error as one more event, in the error shape.
func (e *sse) fail(err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	_ = e.send(ae.body())
	e.done()
}

// completionLogprobs is OpenAI's legacy logprobs object for tokens toks (text offsets from base).
func (s *Server) completionLogprobs(toks []policy.Token, top int, asIDs bool, base int) map[string]any {
	piece := func(id int) string {
		if asIDs {
			return "token_id:" + strconv.Itoa(id)
		}
		return engine.TokenPiece(s.pol.Tok.DecodeBytes([]int{id}))
	}
	tokens := make([]string, len(toks))
	lps := make([]float32, len(toks))
	offsets := make([]int, len(toks))
	tops := make([]map[string]float32, len(toks))
	at := base
	for j, t := range toks {
		tokens[j], lps[j], offsets[j] = piece(t.ID), t.LogProb, at
		at += len(s.pol.Tok.DecodeBytes([]int{t.ID}))
		m := map[string]float32{}
		for _, a := range t.Top[:min(top, len(t.Top))] {
			m[piece(a.ID)] = a.LogProb
		}
		m[tokens[j]] = t.LogProb
		tops[j] = m
	}
	return map[string]any{"tokens": tokens, "token_logprobs": lps, "text_offset": offsets, "top_logprobs": tops}
}

// chatLogprobs is the chat logprobs object ({"content": [...]}) of toks with top alternatives each.
func (s *Server) chatLogprobs(toks []policy.Token, top int) map[string]any {
	entry := func(id int, lp float32) map[string]any {
		b := s.pol.Tok.DecodeBytes([]int{id})
		bs := make([]int, len(b))
		for k, x := range b {
			bs[k] = int(x)
		}
		return map[string]any{"token": s.pol.Tok.Decode([]int{id}), "logprob": lp, "bytes": bs}
	}
	content := make([]map[string]any, len(toks))
	for j, t := range toks {
		e := entry(t.ID, t.LogProb)
		alts := []map[string]any{}
		for _, a := range t.Top[:min(top, len(t.Top))] {
			alts = append(alts, entry(a.ID, a.LogProb))
		}
		e["top_logprobs"] = alts
		content[j] = e
	}
	return map[string]any{"content": content}
}

// parsePrompts reads /v1/completions' prompt: a string, a list of strings, a list of token ids or a
// list of such lists. Text is checked against the model's length before it is tokenized.
func (s *Server) parsePrompts(raw json.RawMessage, maxNew int) ([][]int, error) {
	// Each shape is tried on fresh variables: a failed json.Unmarshal may leave a partial value.
	var texts []string
	var idss [][]int
	var text string
	var ids []int
	switch {
	case len(raw) == 0:
		return nil, badRequest("prompt", "prompt is required")
	case json.Unmarshal(raw, &text) == nil:
		texts = []string{text}
	case json.Unmarshal(raw, &ids) == nil:
		idss = [][]int{ids}
	default:
		var ts []string
		var is [][]int
		if json.Unmarshal(raw, &ts) == nil {
			texts = ts
		} else if json.Unmarshal(raw, &is) == nil {
			idss = is
		} else {
			return nil, badRequest("prompt", "prompt: want a string, a list of strings, a list of token ids or a list of such lists")
		}
	}
	if len(texts) == 0 && len(idss) == 0 {
		return nil, badRequest("prompt", "prompt: the list is empty")
	}
	for i, t := range texts {
		if err := s.precheck("prompt", len(t), maxNew); err != nil {
			if len(texts) > 1 {
				err.(*apiError).msg = fmt.Sprintf("prompt %d: %s", i, err.(*apiError).msg)
			}
			return nil, err
		}
	}
	for _, t := range texts {
		idss = append(idss, s.pol.Tok.Encode(t))
	}
	return idss, nil
}

// completions is POST /v1/completions: one or more prompts (text, tokenized as is with no chat
// template, or token ids), n completions each, streamed or not.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req struct {
		openaiParams
		Prompt   json.RawMessage `json:"prompt"`
		Logprobs *int            `json:"logprobs"`
		Echo     bool            `json:"echo"`
	}
	release, ok := s.readJSON(w, r, &req)
	if !ok {
		return
	}
	defer release()
	lora, err := s.useModel(req.Model)
	if err != nil {
		writeError(w, err)
		return
	}
	defer s.releaseLoRA(lora)
	if req.Echo {
		writeError(w, badRequest("echo", "echo is not supported by drmas serve"))
		return
	}
	top := 0
	if req.Logprobs != nil {
		if top = *req.Logprobs; top < 0 || top > policy.MaxTopLogProbs {
			writeError(w, badRequest("logprobs", "logprobs %d: want 0–%d", top, policy.MaxTopLogProbs))
			return
		}
	}
	maxNew := 16
	if sp := req.sampling(); sp.MaxNewTokens != nil {
		maxNew = *sp.MaxNewTokens
	}
	prompts, err := s.parsePrompts(req.Prompt, maxNew)
	if err != nil {
		writeError(w, err)
		return
	}
	choices, err := s.choicesFor(req.openaiParams, prompts, 16, top, lora)
	if err != nil {
		writeError(w, err)
		return
	}
	s.respond(w, r, choices, req.textOptions(), req.Stream, req.StreamOptions, replyShape{
		object: "text_completion", chunkObject: "text_completion", idPrefix: "cmpl-", prompts: prompts,
		logprobs: req.Logprobs != nil,
		whole: func(i int, t *choiceText, fin string) map[string]any {
			c := map[string]any{"index": i, "text": t.text(), "finish_reason": fin, "logprobs": nil}
			if req.ReturnTokenIDs {
				c["token_ids"] = t.ids()
				c["prompt_token_ids"] = choices[i].prompt
			}
			if req.Logprobs != nil {
				c["logprobs"] = s.completionLogprobs(t.toks, top, req.ReturnTokensAsTokenIDs, 0)
			}
			return c
		},
		piece: func(i int, text string, toks []policy.Token, ids []int, offset int) map[string]any {
			c := map[string]any{"index": i, "text": text, "finish_reason": nil, "logprobs": nil}
			if req.Logprobs != nil {
				c["logprobs"] = s.completionLogprobs(toks, top, req.ReturnTokensAsTokenIDs, offset)
			}
			if req.ReturnTokenIDs {
				c["token_ids"] = ids
			}
			return c
		},
		finish: func(i int, fin string) map[string]any {
			return map[string]any{"index": i, "text": "", "finish_reason": fin, "logprobs": nil}
		},
	})
}

// chat is POST /v1/chat/completions: the messages are rendered with the model's chat template (with
// the request's tools and tool messages: chatToolArgs); n completions, streamed or not.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		openaiParams
		Messages    []llm.Message `json:"messages"` // tool_calls, tool_call_id and name included
		Logprobs    bool          `json:"logprobs"`
		TopLogprobs *int          `json:"top_logprobs"`
		// Raw JSON, so that objects reach the template with their keys in the client's order.
		ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
		Tools              json.RawMessage            `json:"tools"`
		ToolChoice         json.RawMessage            `json:"tool_choice"`
	}
	release, ok := s.readJSON(w, r, &req)
	if !ok {
		return
	}
	defer release()
	lora, err := s.useModel(req.Model)
	if err != nil {
		writeError(w, err)
		return
	}
	defer s.releaseLoRA(lora)
	if len(req.Messages) == 0 {
		writeError(w, badRequest("messages", "messages: at least one is required"))
		return
	}
	top := 0
	if req.TopLogprobs != nil {
		if top = *req.TopLogprobs; top < 0 || top > policy.MaxTopLogProbs {
			writeError(w, badRequest("top_logprobs", "top_logprobs %d: want 0–%d", top, policy.MaxTopLogProbs))
			return
		}
		if top > 0 && !req.Logprobs {
			writeError(w, badRequest("top_logprobs", "top_logprobs needs logprobs: true"))
			return
		}
	}
	maxNew := 256
	if sp := req.sampling(); sp.MaxNewTokens != nil {
		maxNew = *sp.MaxNewTokens
	}
	kwargs, size, err := chatToolArgs(req.Messages, req.Tools, req.ToolChoice, req.ChatTemplateKwargs)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, m := range req.Messages {
		size += len(m.Content) + len(m.ReasoningContent)
	}
	if err := s.precheck("messages", size, maxNew); err != nil {
		writeError(w, err)
		return
	}
	prompt, err := s.pol.EncodePromptWith(req.Messages, kwargs)
	if err != nil {
		writeError(w, badRequest("messages", "%v", err))
		return
	}
	choices, err := s.choicesFor(req.openaiParams, [][]int{prompt}, 256, top, lora)
	if err != nil {
		writeError(w, err)
		return
	}
	s.respond(w, r, choices, req.textOptions(), req.Stream, req.StreamOptions, replyShape{
		object: "chat.completion", chunkObject: "chat.completion.chunk", idPrefix: "chatcmpl-", prompts: [][]int{prompt},
		logprobs: req.Logprobs,
		whole: func(i int, t *choiceText, fin string) map[string]any {
			c := map[string]any{"index": i, "message": map[string]any{"role": "assistant", "content": t.text()},
				"finish_reason": fin, "logprobs": nil}
			if req.ReturnTokenIDs {
				c["token_ids"] = t.ids()
			}
			if req.Logprobs {
				c["logprobs"] = s.chatLogprobs(t.toks, top)
			}
			return c
		},
		// Every choice opens with the assistant role, as OpenAI's first chunk does.
		opening: func(i int) map[string]any {
			return map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}
		},
		piece: func(i int, text string, toks []policy.Token, ids []int, _ int) map[string]any {
			c := map[string]any{"index": i, "delta": map[string]any{"content": text}, "finish_reason": nil, "logprobs": nil}
			if req.Logprobs {
				c["logprobs"] = s.chatLogprobs(toks, top)
			}
			if req.ReturnTokenIDs {
				c["token_ids"] = ids
			}
			return c
		},
		finish: func(i int, fin string) map[string]any {
			return map[string]any{"index": i, "delta": map[string]any{}, "finish_reason": fin, "logprobs": nil}
		},
	})
}

// streamOptions is OpenAI's stream_options.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// replyShape is what tells a /v1/completions reply from a /v1/chat/completions one: the object
// names, and each choice's body whole, as an opening chunk (chat: the role), as a streamed piece (new
// text, its tokens and their ids, the text's offset in the choice) and as the closing chunk.
type replyShape struct {
	object, chunkObject, idPrefix string
	prompts                       [][]int
	logprobs                      bool // asked: a piece is sent for new tokens even without new text
	whole                         func(i int, t *choiceText, finish string) map[string]any
	opening                       func(i int) map[string]any // nil: none
	piece                         func(i int, text string, toks []policy.Token, ids []int, offset int) map[string]any
	finish                        func(i int, finish string) map[string]any
}

// respond generates the choices and answers in one reply or, with stream, as server-sent events:
// each touched choice gets a chunk with its new text and the log-probs of its new tokens, an ended
// one then a chunk with its finish_reason; stream_options.include_usage adds a usage chunk.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, choices []choice, topt textOptions, stream bool, so *streamOptions, rp replyShape) {
	id, created := fmt.Sprintf("%s%d", rp.idPrefix, time.Now().UnixNano()), time.Now().Unix()
	if !stream {
		res, err := s.collect(r, choices, topt, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		out := make([]any, len(choices))
		for i, t := range res.texts {
			out[i] = rp.whole(i, t, finishReason(res.comps[i].Finish))
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": rp.object, "created": created, "model": s.opt.Name,
			"choices": out, "usage": usage(rp.prompts, res)})
		return
	}
	ev := startSSE(w)
	includeUsage := so != nil && so.IncludeUsage
	chunk := func(c map[string]any) map[string]any {
		m := map[string]any{"id": id, "object": rp.chunkObject, "created": created, "model": s.opt.Name, "choices": []any{c}}
		if includeUsage {
			m["usage"] = nil
		}
		return m
	}
	if rp.opening != nil {
		for i := range choices {
			if err := ev.send(chunk(rp.opening(i))); err != nil {
				return
			}
		}
	}
	offsets := make([]int, len(choices))
	res, err := s.collect(r, choices, topt, func(res *result, touched []int, ended map[int]bool) error {
		for _, i := range touched {
			t := res.texts[i]
			text := t.delta(ended[i])
			toks := t.toks[res.sentLP[i]:]
			if text != "" || (rp.logprobs && len(toks) > 0) {
				c := rp.piece(i, text, toks, t.ids()[res.sentLP[i]:], offsets[i])
				res.sentLP[i] = len(t.toks)
				offsets[i] += len(text)
				if err := ev.send(chunk(c)); err != nil {
					return err
				}
			}
			if ended[i] {
				if err := ev.send(chunk(rp.finish(i, finishReason(res.comps[i].Finish)))); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		ev.fail(err)
		return
	}
	if includeUsage {
		_ = ev.send(map[string]any{"id": id, "object": rp.chunkObject, "created": created, "model": s.opt.Name,
			"choices": []any{}, "usage": usage(rp.prompts, res)})
	}
	ev.done()
}
