package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/llm"
)

// openaiParams are the OpenAI sampling fields (plus vLLM's extras) both endpoints take.
type openaiParams struct {
	Model               string      `json:"model"`
	MaxTokens           *int        `json:"max_tokens"`
	MaxCompletionTokens *int        `json:"max_completion_tokens"`
	Temperature         *float64    `json:"temperature"`
	TopP                *float64    `json:"top_p"`
	TopK                *int        `json:"top_k"`
	Seed                *int64      `json:"seed"`
	Stop                stringOrSet `json:"stop"`
	StopTokenIDs        []int       `json:"stop_token_ids"`
	N                   *int        `json:"n"`
	Stream              bool        `json:"stream"`
	// vLLM's: write logprobs.tokens as "token_id:N"; add choices[].token_ids; keep stop strings
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool `json:"return_token_ids"`
}

func (p openaiParams) sampling(defaultMax int) samplingParams {
	limit := p.MaxTokens
	if p.MaxCompletionTokens != nil {
		limit = p.MaxCompletionTokens
	}
	if limit == nil {
		limit = &defaultMax
	}
	return samplingParams{MaxNewTokens: limit, Temperature: p.Temperature, TopP: p.TopP, TopK: p.TopK, Stop: p.Stop,
		StopTokenIDs: p.StopTokenIDs, SamplingSeed: p.Seed, N: p.N}
}

// completions is POST /v1/completions for one prompt: a string (tokenized as is, no chat template)
// or a list of token ids.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req struct {
		openaiParams
		Prompt   json.RawMessage `json:"prompt"`
		Logprobs *int            `json:"logprobs"`
		Echo     bool            `json:"echo"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.Stream || req.Echo {
		writeError(w, http.StatusBadRequest, "stream and echo are not supported by drmas serve")
		return
	}
	var prompt []int
	var text string
	if err := json.Unmarshal(req.Prompt, &text); err == nil {
		prompt = s.pol.Tok.Encode(text)
	} else if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
		writeError(w, http.StatusBadRequest, "prompt: want a string or a list of token ids (one prompt per request; drmas serve batches concurrent requests)")
		return
	}
	comp, _, ok := s.run1(w, r, prompt, req.sampling(16))
	if !ok {
		return
	}
	choice := map[string]any{"index": 0, "text": s.responseText(comp, true), "finish_reason": string(comp.Finish), "logprobs": nil}
	if req.ReturnTokenIDs {
		choice["token_ids"] = comp.ResponseIDs
		choice["prompt_token_ids"] = prompt
	}
	if req.Logprobs != nil {
		tokens := make([]string, len(comp.ResponseIDs))
		offsets := make([]int, len(comp.ResponseIDs))
		top := make([]map[string]float32, len(comp.ResponseIDs))
		at := 0
		for j, id := range comp.ResponseIDs {
			piece := engine.TokenPiece(s.pol.Tok.DecodeBytes([]int{id}))
			tokens[j] = piece
			if req.ReturnTokensAsTokenIDs {
				tokens[j] = "token_id:" + strconv.Itoa(id)
			}
			offsets[j] = at
			at += len(piece)
			top[j] = map[string]float32{tokens[j]: comp.LogProbs[j]}
		}
		choice["logprobs"] = map[string]any{"tokens": tokens, "token_logprobs": comp.LogProbs, "text_offset": offsets, "top_logprobs": top}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": fmt.Sprintf("cmpl-%d", time.Now().UnixNano()), "object": "text_completion",
		"created": time.Now().Unix(), "model": s.opt.Name, "choices": []any{choice}, "usage": usage(prompt, comp)})
}

// chat is POST /v1/chat/completions: the messages are rendered with the model's chat template.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		openaiParams
		Messages []llm.Message `json:"messages"`
		Logprobs bool          `json:"logprobs"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.Stream {
		writeError(w, http.StatusBadRequest, "stream is not supported by drmas serve")
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages: at least one is required")
		return
	}
	prompt, err := s.pol.EncodePrompt(req.Messages)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	comp, _, ok := s.run1(w, r, prompt, req.sampling(256))
	if !ok {
		return
	}
	choice := map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": s.responseText(comp, false)},
		"finish_reason": string(comp.Finish), "logprobs": nil}
	if req.ReturnTokenIDs {
		choice["token_ids"] = comp.ResponseIDs
	}
	if req.Logprobs {
		content := make([]map[string]any, len(comp.ResponseIDs))
		for j, id := range comp.ResponseIDs {
			b := s.pol.Tok.DecodeBytes([]int{id})
			bs := make([]int, len(b))
			for k, x := range b {
				bs[k] = int(x)
			}
			content[j] = map[string]any{"token": s.pol.Tok.Decode([]int{id}), "logprob": comp.LogProbs[j], "bytes": bs, "top_logprobs": []any{}}
		}
		choice["logprobs"] = map[string]any{"content": content}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": fmt.Sprintf("chatcmpl-%d", time.Now().UnixNano()), "object": "chat.completion",
		"created": time.Now().Unix(), "model": s.opt.Name, "choices": []any{choice}, "usage": usage(prompt, comp)})
}

// run1 checks and generates one prompt, answering the error itself when there is one.
func (s *Server) run1(w http.ResponseWriter, r *http.Request, prompt []int, p samplingParams) (llm.Completion, llm.Sampling, bool) {
	sp, err := s.toSampling(p, 16)
	if err == nil {
		err = s.checkPrompt(prompt, sp.MaxNewTokens)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return llm.Completion{}, sp, false
	}
	comp, err := s.submit(r.Context(), prompt, sp)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return llm.Completion{}, sp, false
	}
	return comp, sp, true
}

func usage(prompt []int, c llm.Completion) map[string]int {
	return map[string]int{"prompt_tokens": len(prompt), "completion_tokens": len(c.ResponseIDs), "total_tokens": len(prompt) + len(c.ResponseIDs)}
}
