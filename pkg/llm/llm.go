package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Message is one chat turn handed to a policy; the policy applies its own chat template. The JSON
// field names are OpenAI's (and transformers'), so a chat request's messages decode into it.
type Message struct {
	Role    string `json:"role"` // "system", "user", "assistant" or "tool"
	Content string `json:"content"`
	// ReasoningContent is an assistant turn's reasoning kept apart from its answer (vLLM's and SGLang's
	// reasoning_content); templates that know the field (Qwen3) render it. Empty means no such field.
	ReasoningContent string `json:"reasoning_content,omitempty"`
	// ToolCalls are the functions an assistant turn called. Templates that know tools render them in
	// their family's format (Qwen3's <tool_call> blocks, Llama 3.1's JSON call); nil means the message
	// has no tool_calls field (Llama 3.1's template tests for the field, not for its length).
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is, on a "tool" message, the id of the call it answers (OpenAI's tool_call_id;
	// Mistral's templates render it). Empty means no such field.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Name is, on a "tool" message, the function whose result it carries. Empty means no such field.
	Name string `json:"name,omitempty"`
}

// ToolCall is one function call of an assistant turn, in the shape of OpenAI's and transformers'
// messages: {"id": …, "type": "function", "function": {"name": …, "arguments": …}}.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall is the function a ToolCall names and the arguments it passes.
type FunctionCall struct {
	Name string `json:"name"`
	// Arguments is raw JSON: an object (transformers' form, which chat templates expect: Qwen3's
	// writes a mapping with tojson, Llama 3.1's always does) or a string holding JSON (OpenAI's wire
	// form, which Qwen3's template writes as it is and Llama 3.1's would quote). A template sees an
	// object's keys in their order here. ObjectArguments turns the string form into the object form.
	Arguments json.RawMessage `json:"arguments"`
}

// ObjectArguments returns c's arguments as a JSON object: an object as it is, a string holding a
// JSON object (OpenAI's form) decoded, as vLLM does before it renders a conversation; empty or
// null arguments are {}. Anything else is an error naming the function.
func (c FunctionCall) ObjectArguments() (json.RawMessage, error) {
	raw := bytes.TrimSpace(c.Arguments)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return json.RawMessage("{}"), nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("tool call %q: arguments: %w", c.Name, err)
		}
		raw = bytes.TrimSpace([]byte(s))
	}
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return nil, fmt.Errorf("tool call %q: arguments must be a JSON object (or a string holding one), got %.80s", c.Name, c.Arguments)
	}
	return json.RawMessage(raw), nil
}

// Sampling holds the per-request decoding settings. Temperature 0 means greedy decoding.
type Sampling struct {
	Temperature  float64  `json:"temperature"`
	TopP         float64  `json:"top_p"`          // 0 or 1 = off
	TopK         int      `json:"top_k"`          // 0 = off
	MaxNewTokens int      `json:"max_new_tokens"` // must be > 0
	Stop         []string `json:"stop,omitempty"` // stop strings (the model's end-of-turn token always stops)
	Seed         int64    `json:"seed"`           // base seed; the policy derives per-row streams from it
}

// Request asks the policy playing Agent (on model Model) for one completion of Messages.
type Request struct {
	Agent    string
	Model    string
	Messages []Message
	Sampling Sampling
	// ChatTemplateKwargs are extra chat-template variables, as vLLM and SGLang take them per request
	// (enable_thinking, date_string, tools, ...); nil for none.
	ChatTemplateKwargs map[string]any
	// Text, when set, is a raw prompt (OpenAI's /v1/completions): tokenized as it is, without the chat
	// template; Messages and ChatTemplateKwargs are then unused.
	Text string
	// FitContext asks a generator that knows the model's context to fit the request into it instead
	// of refusing the batch: max_new_tokens is cut to the room the prompt leaves, and a prompt that
	// leaves none completes with FinishOverlong and nothing generated. Rollouts set it: a later turn's
	// prompt grows with the episode, and one long record must not end a run.
	FitContext bool
	// MaxPromptTokens, with FitContext, bounds the prompt too (data.max_prompt_length, which the
	// memory plan takes as every turn's bound): a longer prompt completes with FinishOverlong and
	// nothing generated. 0 = the context alone.
	MaxPromptTokens int
}

// Overlong says whether a request of prompt tokens is over its own prompt bound (MaxPromptTokens,
// with FitContext).
func (r Request) Overlong(prompt int) bool {
	return r.FitContext && r.MaxPromptTokens > 0 && prompt > r.MaxPromptTokens
}

// Finish says why generation of one completion ended.
type Finish string

// Finish reasons.
const (
	FinishStop   Finish = "stop"   // end-of-turn token or a stop string
	FinishLength Finish = "length" // MaxNewTokens reached
	FinishAbort  Finish = "abort"  // the request's client left (a server's streamed rows)
	// FinishOverlong: the prompt left no room in the model's context (Request.FitContext), or was
	// longer than Request.MaxPromptTokens; nothing was generated.
	FinishOverlong Finish = "overlong"
)

// Completion is the policy's answer to one Request. ResponseIDs are exactly the sampled tokens (training
// uses them, never a re-encoding of Text) and LogProbs their log-probabilities under the sampling policy.
type Completion struct {
	Text        string
	PromptIDs   []int
	ResponseIDs []int
	LogProbs    []float32
	Finish      Finish
	// Replica is the serving engine replica that sampled it (its base URL); "" in-process.
	Replica string
	// Version is the weights that sampled it on a serving engine (unknown in-process).
	Version Version
	// Routes are the experts a mixture-of-experts model routed the completion's tokens to (prompt
	// and response but the last token; nil for a dense model, or an engine that does not return
	// them): what routing replay trains with.
	Routes *Routes
}

// Version is the weights a completion was sampled with, as the engine that answered knows them: the
// trained model's step (the iteration whose weights; 0 = the starting ones) and, for a LoRA adapter
// served on its base's engine, the name the engine loaded that version under. It is carried as a
// value with every completion and call; its String is only the engines' wire and transcripts'
// spelling, never read back. The zero value is unknown: sampled in-process (by the weights being
// trained), or by a replica never synced.
type Version struct {
	Step    int
	Adapter string // the engine's name of the adapter version ("" for a full model's weights)
	Known   bool   // Step is the sampling weights' step
}

// StepVersion is the version of a full model's weights of step.
func StepVersion(step int) Version { return Version{Step: step, Known: true} }

// String is the version as engines and transcripts spell it: v<step> for a full model, the adapter
// version's engine name for an adapter, "" when unknown.
func (v Version) String() string {
	switch {
	case v.Adapter != "":
		return v.Adapter
	case v.Known:
		return "v" + strconv.Itoa(v.Step)
	}
	return ""
}

// Generator produces completions for a batch of requests; the result is aligned with reqs.
// Implementations must batch internally; orchestras hand each agent all its pending prompts at once.
type Generator interface {
	Generate(ctx context.Context, reqs []Request) ([]Completion, error)
}

// Bounds on sampling settings that no model could use, so that a typo fails at once instead of
// allocating for it. The model's own limit (max_position_embeddings) is checked where the model is known.
const (
	MaxStops      = 64  // stop strings per request
	MaxStopLength = 256 // bytes per stop string
	MaxNewTokens  = 1 << 20
)

// ErrBadRequest marks a request that no generation could serve (bad settings, a prompt too long
// for the model): the caller's input, not a failure of the generator.
var ErrBadRequest = errors.New("bad request")

// Problem is one out-of-range sampling setting, named by its config key (temperature, top_p, top_k,
// max_new_tokens, stop).
type Problem struct {
	Key string
	Msg string
}

func (p Problem) Error() string { return p.Key + ": " + p.Msg }

// Check reports every setting out of range. It is the one owner of the sampling rules: the config's
// agents, `drmas generate` and the policy all call it. Temperature 0 is greedy; top_p 0 and 1 mean
// off; top_k 0 means off; max_new_tokens must be ≥ 1.
func (s Sampling) Check() []Problem {
	var out []Problem
	bad := func(key, format string, args ...any) {
		out = append(out, Problem{key, fmt.Sprintf(format, args...)})
	}
	if !(s.Temperature >= 0) || math.IsInf(s.Temperature, 0) {
		bad("temperature", "must be finite and ≥ 0, 0 = greedy (got %g)", s.Temperature)
	}
	if !(s.TopP >= 0 && s.TopP <= 1) {
		bad("top_p", "must be in [0, 1], 0 or 1 = off (got %g)", s.TopP)
	}
	if s.TopK < 0 {
		bad("top_k", "must be ≥ 0, 0 = off (got %d)", s.TopK)
	}
	if s.MaxNewTokens < 1 || s.MaxNewTokens > MaxNewTokens {
		bad("max_new_tokens", "must be in [1, %d] (got %d)", MaxNewTokens, s.MaxNewTokens)
	}
	if len(s.Stop) > MaxStops {
		bad("stop", "at most %d stop strings (got %d)", MaxStops, len(s.Stop))
	}
	for i, st := range s.Stop {
		if len(st) > MaxStopLength {
			bad(fmt.Sprintf("stop[%d]", i), "at most %d bytes (got %d)", MaxStopLength, len(st))
			break
		}
	}
	return out
}
