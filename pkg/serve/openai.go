package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

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
	Seed                *int64         `json:"seed"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	// vLLM's: write logprobs.tokens as "token_id:N"; add choices[].token_ids; keep stop strings
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool `json:"return_token_ids"`
	IncludeStopStrInOutput bool `json:"include_stop_str_in_output"`
	commonParams
	unsupportedParams
}

func (p openaiParams) sampling() samplingParams {
	limit, name := p.MaxTokens, "max_tokens"
	if p.MaxCompletionTokens != nil {
		limit, name = p.MaxCompletionTokens, "max_completion_tokens"
	}
	return samplingParams{commonParams: p.commonParams, MaxNewTokens: limit, SamplingSeed: p.Seed, maxName: name}
}

func (p openaiParams) textOptions() textOptions {
	return textOptions{stops: p.Stop, keepStop: p.IncludeStopStrInOutput, keepSpecial: p.keepSpecial()}
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
	done, lora, ok := s.readOpenAI(w, r, &req)
	if !ok {
		return
	}
	defer done()
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

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	openaiParams
	Messages    []llm.Message `json:"messages"` // tool_calls, tool_call_id and name included
	Logprobs    bool          `json:"logprobs"`
	TopLogprobs *int          `json:"top_logprobs"`
	// Raw JSON, so that objects reach the template with their keys in the client's order.
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
	Tools              json.RawMessage            `json:"tools"`
	ToolChoice         json.RawMessage            `json:"tool_choice"`
}

// chat is POST /v1/chat/completions: the messages are rendered with the model's chat template (with
// the request's tools and tool messages: chatToolArgs); n completions, streamed or not.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	done, lora, ok := s.readOpenAI(w, r, &req)
	if !ok {
		return
	}
	defer done()
	if len(req.Messages) == 0 {
		writeError(w, badRequest("messages", "messages: at least one is required"))
		return
	}
	top, err := req.top()
	if err != nil {
		writeError(w, err)
		return
	}
	prompt, err := s.chatPrompt(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	choices, err := s.choicesFor(req.openaiParams, [][]int{prompt}, 256, top, lora)
	if err != nil {
		writeError(w, err)
		return
	}
	s.respond(w, r, choices, req.textOptions(), req.Stream, req.StreamOptions, s.chatShape(&req, prompt, top))
}

// top is the number of alternatives asked per token (top_logprobs, which needs logprobs: true).
func (req *chatRequest) top() (int, error) {
	if req.TopLogprobs == nil {
		return 0, nil
	}
	top := *req.TopLogprobs
	if top < 0 || top > policy.MaxTopLogProbs {
		return 0, badRequest("top_logprobs", "top_logprobs %d: want 0–%d", top, policy.MaxTopLogProbs)
	}
	if top > 0 && !req.Logprobs {
		return 0, badRequest("top_logprobs", "top_logprobs needs logprobs: true")
	}
	return top, nil
}

// chatPrompt renders the messages (and the tools) with the model's chat template into token ids,
// after the precheck that their text can fit the model with the new tokens asked.
func (s *Server) chatPrompt(req *chatRequest) ([]int, error) {
	maxNew := 256
	if sp := req.sampling(); sp.MaxNewTokens != nil {
		maxNew = *sp.MaxNewTokens
	}
	kwargs, size, err := chatToolArgs(req.Messages, req.Tools, req.ToolChoice, req.ChatTemplateKwargs)
	if err != nil {
		return nil, err
	}
	for _, m := range req.Messages {
		size += len(m.Content) + len(m.ReasoningContent)
	}
	if err := s.precheck("messages", size, maxNew); err != nil {
		return nil, err
	}
	prompt, err := s.pol.EncodePromptWith(req.Messages, kwargs)
	if err != nil {
		return nil, badRequest("messages", "%v", err)
	}
	return prompt, nil
}

// chatShape is the shape of a chat reply: a message per choice, or streamed deltas that open with
// the assistant role.
func (s *Server) chatShape(req *chatRequest, prompt []int, top int) replyShape {
	return replyShape{
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
	}
}

// readOpenAI reads an OpenAI request's body into req and takes the model it names: the base (lora
// nil) or a loaded adapter, held until done is called. When ok is false the error has been answered.
func (s *Server) readOpenAI(w http.ResponseWriter, r *http.Request, req interface{ modelName() string }) (done func(), lora *served, ok bool) {
	release, ok := s.readJSON(w, r, req)
	if !ok {
		return nil, nil, false
	}
	lora, err := s.useModel(req.modelName())
	if err != nil {
		writeError(w, err)
		release()
		return nil, nil, false
	}
	return func() { s.releaseLoRA(lora); release() }, lora, true
}

// modelName is the "model" the request names.
func (p *openaiParams) modelName() string { return p.Model }

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
	model := s.opt.Name // the weights that answer: the base, or the adapter the request named
	if len(choices) > 0 && choices[0].lora != nil {
		model = choices[0].lora.name
	}
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
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": rp.object, "created": created, "model": model,
			"choices": out, "usage": usage(rp.prompts, res)})
		return
	}
	ev := startSSE(w)
	includeUsage := so != nil && so.IncludeUsage
	chunk := func(c map[string]any) map[string]any {
		m := map[string]any{"id": id, "object": rp.chunkObject, "created": created, "model": model, "choices": []any{c}}
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
		_ = ev.send(map[string]any{"id": id, "object": rp.chunkObject, "created": created, "model": model,
			"choices": []any{}, "usage": usage(rp.prompts, res)})
	}
	ev.done()
}
