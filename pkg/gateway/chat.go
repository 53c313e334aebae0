package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/toolcall"
)

// chat answers POST …/v1/chat/completions: the messages rendered with the agent's model's chat
// template (tools as transformers passes them), sampled with the agent's settings, each choice a
// call of the episode; tool calls in an answer come back as OpenAI tool_calls, read in the agent's
// model's format.
func (s *server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	var tools bool
	build := func(a *agentSpec) (lr llm.Request, n int, e *apiError) {
		lr, n, tools, e = chatCall(a, &req)
		return lr, n, e
	}
	s.handle(w, r, &req, build, func(c *served) {
		resp := chatResponse{answerHead: c.head("chatcmpl", "chat.completion"), Usage: c.usage()}
		for i, comp := range c.comps {
			msg, finish, valid := answer(c.a, comp, tools, c.first+i)
			c.record(i, valid)
			resp.Choices = append(resp.Choices, chatChoice{Index: i, Message: msg, FinishReason: finish})
		}
		if req.Stream {
			streamChat(w, resp, req.includeUsage())
			return
		}
		writeJSON(w, resp)
	})
}

// overlong is the error of a conversation of tokens that leaves no room for agent's answer.
func (*chatRequest) overlong(tokens int, agent string) *apiError {
	return badRequest("messages", "the conversation is %d tokens: over data.max_prompt_length, or leaving no room in agent %s's model's context for an answer", tokens, agent)
}

// chatCall turns a chat request into the agent's request: its messages, its tools (unless
// tool_choice is "none"), its sampling (the agent's own, max_tokens lowered, stop strings added).
func chatCall(a *agentSpec, req *chatRequest) (llm.Request, int, bool, *apiError) {
	if len(req.Messages) == 0 {
		return llm.Request{}, 0, false, badRequest("messages", "messages: at least one message is required")
	}
	msgs, e := messages(req.Messages)
	if e != nil {
		return llm.Request{}, 0, false, e
	}
	if req.Logprobs != nil && *req.Logprobs || req.TopLogprobs != nil && *req.TopLogprobs > 0 {
		return llm.Request{}, 0, false, badRequest("logprobs", "logprobs are not served by the gateway (it keeps the sampled tokens' log-probs for training)")
	}
	if rf := bytes.TrimSpace(req.ResponseFormat); len(rf) > 0 && string(rf) != "null" {
		var f struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(rf, &f) != nil || f.Type != "text" {
			return llm.Request{}, 0, false, badRequest("response_format", "response_format %s is not implemented: the agent answers in free text (type \"text\")", rf)
		}
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	samp, n, e := a.sampling(&req.callParams, maxTokens)
	if e != nil {
		return llm.Request{}, 0, false, e
	}
	lr := llm.Request{Agent: a.name, Model: a.model, Messages: msgs, Sampling: samp, ChatTemplateKwargs: a.kwargs, FitContext: true, MaxPromptTokens: a.maxPrompt}
	tools := hasTools(req.Tools)
	switch choice := trimQuote(req.ToolChoice); {
	case choice == "none":
		tools = false
	case len(bytes.TrimSpace(req.ToolChoice)) > 0 && string(bytes.TrimSpace(req.ToolChoice)) != "null" && choice != "auto":
		return llm.Request{}, 0, false, badRequest("tool_choice", "tool_choice %s cannot be honoured: the agent's model chooses (send \"auto\" or \"none\")", req.ToolChoice)
	}
	if tools {
		if a.format == "" {
			return llm.Request{}, 0, false, badRequest("tools", "agent %s's model has no known tool-call format: set agents[].tool_format", a.name)
		}
		kw := map[string]any{}
		for k, v := range a.kwargs {
			kw[k] = v
		}
		kw["tools"] = req.Tools // as transformers passes them to the template (JSON keeps its key order)
		lr.ChatTemplateKwargs = kw
	}
	return lr, n, tools, nil
}

// answer is a completion as the chat message a client reads: with tools offered, the calls it
// makes in the agent's model's format become tool_calls (ids from the call's position); a malformed
// call leaves the text as it is and makes the call invalid (scored with the orchestra's penalty).
func answer(a *agentSpec, c llm.Completion, tools bool, pos int) (chatMessage, string, bool) {
	text := c.Text
	msg := chatMessage{Role: "assistant", Content: &text}
	if !tools {
		return msg, finishReason(c.Finish, false), true
	}
	res, err := toolcall.Parse(a.format, c.Text)
	if err != nil {
		return msg, finishReason(c.Finish, false), false
	}
	if len(res.Calls) == 0 {
		return msg, finishReason(c.Finish, false), true
	}
	content := res.Content
	msg.Content = &content
	if content == "" {
		msg.Content = nil
	}
	msg.ToolCalls = toolcall.ToolCalls(res.Calls, func(i int) string { return fmt.Sprintf("call_%d_%d", pos, i) })
	for i := range msg.ToolCalls { // OpenAI's wire: the arguments as a string holding the JSON object
		f := &msg.ToolCalls[i].Function
		f.Arguments = json.RawMessage(jsonString(string(f.Arguments)))
	}
	return msg, finishReason(c.Finish, true), true
}

// streamChat writes a chat answer as OpenAI's server-sent events: per choice its role, its content
// and its tool calls as deltas, then its finish reason; usage when asked; then [DONE].
func streamChat(w http.ResponseWriter, resp chatResponse, withUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	chunk := func(choices []map[string]any, u *usage) {
		c := map[string]any{"id": resp.ID, "object": "chat.completion.chunk", "created": resp.Created, "model": resp.Model, "choices": choices}
		if u != nil {
			c["usage"] = u
		}
		writeEvent(w, c)
	}
	for _, ch := range resp.Choices {
		chunk([]map[string]any{{"index": ch.Index, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}}, nil)
		if ch.Message.Content != nil && *ch.Message.Content != "" {
			chunk([]map[string]any{{"index": ch.Index, "delta": map[string]any{"content": *ch.Message.Content}, "finish_reason": nil}}, nil)
		}
		for k, tc := range ch.Message.ToolCalls {
			var args string
			_ = json.Unmarshal(tc.Function.Arguments, &args)
			chunk([]map[string]any{{"index": ch.Index, "delta": map[string]any{"tool_calls": []map[string]any{{"index": k, "id": tc.ID, "type": "function",
				"function": map[string]any{"name": tc.Function.Name, "arguments": args}}}}, "finish_reason": nil}}, nil)
		}
		chunk([]map[string]any{{"index": ch.Index, "delta": map[string]any{}, "finish_reason": ch.FinishReason}}, nil)
	}
	if withUsage {
		chunk([]map[string]any{}, &resp.Usage)
	}
	writeDone(w)
}

// writeEvent writes one server-sent event holding v as JSON.
func writeEvent(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "data: %s\n\n", b)
}

// writeDone ends a stream.
func writeDone(w http.ResponseWriter) {
	fmt.Fprint(w, "data: [DONE]\n\n")
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// hasTools says whether a request's tools are a non-empty list.
func hasTools(raw json.RawMessage) bool {
	var list []json.RawMessage
	return json.Unmarshal(raw, &list) == nil && len(list) > 0
}
