package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/drmas/drmas/pkg/llm"
)

// completions answers POST …/v1/completions: a raw prompt, tokenized as it is (no chat template),
// sampled with the agent's settings, each choice a call of the episode.
func (s *server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	build := func(a *agentSpec) (llm.Request, int, *apiError) { return completionCall(a, &req) }
	s.handle(w, r, &req, build, func(c *served) {
		resp := completionResponse{answerHead: c.head("cmpl", "text_completion"), Usage: c.usage()}
		for i, comp := range c.comps {
			c.record(i, true)
			resp.Choices = append(resp.Choices, completionChoice{Index: i, Text: comp.Text, FinishReason: finishReason(comp.Finish, false)})
		}
		if req.Stream {
			streamCompletion(w, resp, req.includeUsage())
			return
		}
		writeJSON(w, resp)
	})
}

// overlong is the error of a prompt of tokens that leaves no room for agent's answer.
func (*completionRequest) overlong(tokens int, agent string) *apiError {
	return badRequest("prompt", "the prompt is %d tokens: over data.max_prompt_length, or leaving no room in agent %s's model's context", tokens, agent)
}

// completionCall turns a completions request into the agent's request.
func completionCall(a *agentSpec, req *completionRequest) (llm.Request, int, *apiError) {
	var prompt string
	if json.Unmarshal(req.Prompt, &prompt) != nil {
		var list []string
		if json.Unmarshal(req.Prompt, &list) != nil || len(list) != 1 {
			return llm.Request{}, 0, badRequest("prompt", "prompt must be a string (or a list of one): one episode call at a time")
		}
		prompt = list[0]
	}
	if prompt == "" {
		return llm.Request{}, 0, badRequest("prompt", "prompt is empty")
	}
	switch {
	case req.Logprobs != nil && *req.Logprobs > 0:
		return llm.Request{}, 0, badRequest("logprobs", "logprobs are not served by the gateway")
	case req.Echo, req.Suffix != "", req.BestOf != nil && *req.BestOf > 1:
		return llm.Request{}, 0, badRequest("echo", "echo, suffix and best_of are not implemented by the gateway")
	}
	samp, n, e := a.sampling(&req.callParams, req.MaxTokens)
	if e != nil {
		return llm.Request{}, 0, e
	}
	return llm.Request{Agent: a.name, Model: a.model, Text: prompt, Sampling: samp, FitContext: true, MaxPromptTokens: a.maxPrompt}, n, nil
}

// streamCompletion writes a completion as server-sent events.
func streamCompletion(w http.ResponseWriter, resp completionResponse, withUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ch := range resp.Choices {
		writeEvent(w, map[string]any{"id": resp.ID, "object": "text_completion", "created": resp.Created, "model": resp.Model,
			"choices": []map[string]any{{"index": ch.Index, "text": ch.Text, "finish_reason": nil}}})
		writeEvent(w, map[string]any{"id": resp.ID, "object": "text_completion", "created": resp.Created, "model": resp.Model,
			"choices": []map[string]any{{"index": ch.Index, "text": "", "finish_reason": ch.FinishReason}}})
	}
	if withUsage {
		writeEvent(w, map[string]any{"id": resp.ID, "object": "text_completion", "created": resp.Created, "model": resp.Model, "choices": []any{}, "usage": resp.Usage})
	}
	writeDone(w)
}
