package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/drmas/drmas/pkg/llm"
)

// The OpenAI chat-completions wire, as far as a training gateway speaks it: what a runner's client
// (the official SDKs, LangGraph, the Agents SDK) sends, and what it gets back.

// callParams are the fields both endpoints take: the agent (as the model), how many samples, how
// they are sampled and where they stop, whether the answer streams. Sampling parameters are
// pointers: a runner that does not send one leaves the agent's own in force; one that does must send
// the agent's own. Seed and user are accepted without effect on sampling (the gateway derives each
// call's seed from the run's, so a run is reproducible whoever plays it).
type callParams struct {
	Model             string          `json:"model"`
	N                 *int            `json:"n"`
	Stop              json.RawMessage `json:"stop"`
	MaxTokens         *int            `json:"max_tokens"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	Stream            bool            `json:"stream"`
	StreamOptions     *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Seed *int64 `json:"seed"`
	User string `json:"user"`
}

// params are the fields of a request both endpoints take (request).
func (p *callParams) params() *callParams { return p }

// includeUsage says whether a streamed answer ends with the usage.
func (p *callParams) includeUsage() bool {
	return p.StreamOptions != nil && p.StreamOptions.IncludeUsage
}

// chatRequest is a POST /v1/chat/completions body.
type chatRequest struct {
	callParams
	Messages            []wireMessage   `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	// Accepted and without effect: tags of the request.
	Metadata          json.RawMessage `json:"metadata"`
	Store             *bool           `json:"store"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	ServiceTier       string          `json:"service_tier"`
}

// completionRequest is a POST /v1/completions body: a raw prompt, no chat template.
type completionRequest struct {
	callParams
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	Echo     bool            `json:"echo"`
	Suffix   string          `json:"suffix"`
	BestOf   *int            `json:"best_of"`
	Metadata any             `json:"metadata"`
}

// chatMessage is an answer's message.
type chatMessage struct {
	Role      string         `json:"role"`
	Content   *string        `json:"content"`
	ToolCalls []llm.ToolCall `json:"tool_calls,omitempty"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	FinishReason string      `json:"finish_reason"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// answerHead is what both endpoints' answers begin with.
type answerHead struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
}

type chatResponse struct {
	answerHead
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	FinishReason string  `json:"finish_reason"`
	Logprobs     *string `json:"logprobs"`
}

type completionResponse struct {
	answerHead
	Choices []completionChoice `json:"choices"`
	Usage   usage              `json:"usage"`
}

// apiError is OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status  int
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   string `json:"param,omitempty"`
	Code    string `json:"code,omitempty"`
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: "invalid_request_error", Param: param}
}

// writeError writes an OpenAI error body with its status.
func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(map[string]*apiError{"error": e})
}

// writeJSON writes a 200 JSON body.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// maxBody bounds a request body: a conversation of many turns with tool schemas fits in a few MB.
const maxBody = 16 << 20

// decodeBody reads a JSON body into v, bounded by maxBody; an unreadable body is a 400 naming why.
func decodeBody(r *http.Request, v any) *apiError {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return badRequest("", "reading the request: %v", err)
	}
	if len(b) > maxBody {
		return &apiError{status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body over %d bytes", maxBody), Type: "invalid_request_error"}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return badRequest("", "the request is not the JSON the endpoint takes: %v", err)
	}
	return nil
}

// stopStrings reads OpenAI's stop: a string or a list of strings.
func stopStrings(raw json.RawMessage) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop must be a string or a list of strings")
	}
	if len(many) > llm.MaxStops {
		return nil, badRequest("stop", "at most %d stop strings (got %d)", llm.MaxStops, len(many))
	}
	return many, nil
}

// offTopP says whether a top_p is "off": 0 and 1 both are.
func offTopP(v float64) bool { return v == 0 || v >= 1 }

// sampling reads how a request's call is sampled: how many completions (n), and the agent's
// sampling with max_tokens (maxTokens: the request's, or its equivalent) lowering the agent's own and
// the request's stop strings added. The sampling parameters a request sends must be the agent's own
// (the behaviour policy training corrects for is the agent's: a runner may not change it).
func (a *agentSpec) sampling(f *callParams, maxTokens *int) (llm.Sampling, int, *apiError) {
	s := a.sampling0
	n, e := choices(f.N)
	if e != nil {
		return s, 0, e
	}
	stop, e := stopStrings(f.Stop)
	if e != nil {
		return s, 0, e
	}
	differs := func(param string, sent, own any) *apiError {
		return badRequest(param, "%s %v differs from agent %s's %v (agents[].sampling): the gateway samples with the agent's own settings, the behaviour policy training corrects for; leave %s out or send the agent's value",
			param, sent, a.name, own, param)
	}
	if v := f.Temperature; v != nil && *v != s.Temperature {
		return s, 0, differs("temperature", *v, s.Temperature)
	}
	if v := f.TopP; v != nil && *v != s.TopP && !(offTopP(*v) && offTopP(s.TopP)) {
		return s, 0, differs("top_p", *v, s.TopP)
	}
	if v := f.TopK; v != nil && *v != s.TopK && !(*v <= 0 && s.TopK <= 0) {
		return s, 0, differs("top_k", *v, s.TopK)
	}
	for _, p := range []struct {
		name string
		v    *float64
		off  float64
	}{{"presence_penalty", f.PresencePenalty, 0}, {"frequency_penalty", f.FrequencyPenalty, 0}, {"repetition_penalty", f.RepetitionPenalty, 1}} {
		if p.v != nil && *p.v != p.off {
			return s, 0, differs(p.name, *p.v, p.off)
		}
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return s, 0, badRequest("max_tokens", "max_tokens must be ≥ 1 (got %d)", *maxTokens)
		}
		s.MaxNewTokens = min(s.MaxNewTokens, *maxTokens) // may only lower the agent's own
	}
	if len(stop) > 0 {
		s.Stop = append(append([]string(nil), s.Stop...), stop...)
	}
	return s, n, nil
}

// choices reads n: how many completions, each one sample of the agent.
func choices(n *int) (int, *apiError) {
	if n == nil {
		return 1, nil
	}
	if *n < 1 || *n > maxChoices {
		return 0, badRequest("n", "n must be in [1, %d] (got %d)", maxChoices, *n)
	}
	return *n, nil
}

// maxChoices bounds n.
const maxChoices = 16

// finishReason is OpenAI's name of a completion's end.
func finishReason(f llm.Finish, tools bool) string {
	switch {
	case tools:
		return "tool_calls"
	case f == llm.FinishLength:
		return "length"
	}
	return "stop"
}

// jsonString quotes s as JSON.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// trimQuote reads a JSON string value without its quotes ("" for anything else).
func trimQuote(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return strings.TrimSpace(s)
}

// wireMessage is a chat message as clients send it: content a string, a list of parts or null
// (an assistant turn of tool calls), tool calls' arguments OpenAI's string form.
type wireMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	ToolCalls        []llm.ToolCall  `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
	Name             string          `json:"name"`
}

// messages turns the wire messages into the seam's, as the chat template takes them: content parts
// joined (text parts only), tool calls' arguments as JSON objects (as vLLM renders them).
func messages(in []wireMessage) ([]llm.Message, *apiError) {
	out := make([]llm.Message, len(in))
	for i, m := range in {
		param := fmt.Sprintf("messages[%d]", i)
		if m.Role == "" {
			return nil, badRequest(param+".role", "%s has no role", param)
		}
		text, e := contentText(m.Content, param)
		if e != nil {
			return nil, e
		}
		out[i] = llm.Message{Role: m.Role, Content: text, ReasoningContent: m.ReasoningContent, ToolCallID: m.ToolCallID, Name: m.Name}
		for k, tc := range m.ToolCalls {
			args, err := tc.Function.ObjectArguments()
			if err != nil {
				return nil, badRequest(fmt.Sprintf("%s.tool_calls[%d]", param, k), "%v", err)
			}
			tc.Function.Arguments = args
			if tc.Type == "" {
				tc.Type = "function"
			}
			out[i].ToolCalls = append(out[i].ToolCalls, tc)
		}
	}
	return out, nil
}

// contentText reads a message's content: a string, null, or a list of parts whose text parts are
// joined (an image or audio part is refused: the agents' models read text).
func contentText(raw json.RawMessage, param string) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param+".content", "%s.content must be a string or a list of text parts", param)
	}
	var b strings.Builder
	for k, p := range parts {
		if p.Type != "text" {
			return "", badRequest(fmt.Sprintf("%s.content[%d]", param, k), "content part of type %q: the agents' models read text only", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}
