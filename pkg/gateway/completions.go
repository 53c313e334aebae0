package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/drmas/drmas/pkg/llm"
)

// completions answers POST …/v1/completions: a raw prompt, tokenized as it is (no chat template),
// sampled with the agent's settings, each choice a call of the episode.
func (s *server) completions(w http.ResponseWriter, r *http.Request) {
	se := s.authorize(w, r)
	if se == nil {
		return
	}
	defer se.serving()()
	var req completionRequest
	if e := decodeBody(r, &req); e != nil {
		writeError(w, e)
		return
	}
	a, e := s.agent(req.Model)
	if e != nil {
		writeError(w, e)
		return
	}
	lr, n, e := completionCall(a, &req)
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
	resp := completionResponse{ID: "cmpl-" + se.id + "-" + strconv.Itoa(first), Object: "text_completion", Created: time.Now().Unix(), Model: a.name}
	for i, c := range comps {
		if c.Finish == llm.FinishOverlong {
			writeError(w, badRequest("prompt", "the prompt is %d tokens: it leaves no room in agent %s's model's context", len(c.PromptIDs), a.name))
			return
		}
		se.call(a, first+i, lr, c, true, took/time.Duration(len(comps)))
		resp.Choices = append(resp.Choices, completionChoice{Index: i, Text: c.Text, FinishReason: finishReason(c.Finish, false)})
		resp.Usage.PromptTokens = len(c.PromptIDs)
		resp.Usage.CompletionTokens += len(c.ResponseIDs)
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	if req.Stream {
		streamCompletion(w, resp, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		return
	}
	writeJSON(w, resp)
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
	n, e := choices(req.N)
	if e != nil {
		return llm.Request{}, 0, e
	}
	stop, e := stopStrings(req.Stop)
	if e != nil {
		return llm.Request{}, 0, e
	}
	samp, e := a.sampling(samplingFields{Temperature: req.Temperature, TopP: req.TopP, TopK: req.TopK, PresencePenalty: req.PresencePenalty,
		FrequencyPenalty: req.FrequencyPenalty, RepetitionPenalty: req.RepetitionPenalty}, req.MaxTokens, stop)
	if e != nil {
		return llm.Request{}, 0, e
	}
	return llm.Request{Agent: a.name, Model: a.model, Text: prompt, Sampling: samp, FitContext: true}, n, nil
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
