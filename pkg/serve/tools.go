package serve

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/drmas/drmas/pkg/llm"
)

// chatToolArgs checks and prepares what a chat request says about tools, as vLLM does before it
// renders the conversation: the tool definitions (OpenAI's tools) become the chat template's tools
// argument, kept as raw JSON so that their keys reach the template in the client's order, beside
// the request's chat_template_kwargs (also raw); each assistant tool call's arguments become the
// JSON object they hold (OpenAI sends a string; templates want a mapping: Llama 3.1's would quote a
// string); a call without a type is a "function" call. tool_choice may be absent, "auto" or
// "none": drmas serve does not constrain generation, so "required" or a named function is refused
// rather than not honoured. The reply carries the model's calls as the text it wrote (in its
// family's format, which pkg/toolcall reads); it returns no tool_calls. size is the bytes the
// tools and tool calls add to the prompt, for the length precheck.
func chatToolArgs(msgs []llm.Message, tools, toolChoice json.RawMessage, kwargs map[string]json.RawMessage) (map[string]any, int, error) {
	if present(toolChoice) {
		var choice string
		if err := json.Unmarshal(toolChoice, &choice); err != nil || (choice != "auto" && choice != "none") {
			return nil, 0, badRequest("tool_choice", `tool_choice %.80s: not supported by drmas serve (it does not constrain generation to a tool call); leave it out or send "auto" or "none"`, toolChoice)
		}
	}
	size := 0
	var out map[string]any
	if len(kwargs) > 0 || present(tools) {
		out = make(map[string]any, len(kwargs)+1)
		for k, v := range kwargs {
			out[k] = v
			size += len(v)
		}
	}
	if present(tools) {
		if _, dup := kwargs["tools"]; dup {
			return nil, 0, badRequest("tools", "tools: given both as tools and in chat_template_kwargs; send one")
		}
		var list []map[string]json.RawMessage
		if err := json.Unmarshal(tools, &list); err != nil {
			return nil, 0, badRequest("tools", "tools: want a list of {\"type\": \"function\", \"function\": {...}}: %v", err)
		}
		for i, tool := range list {
			var fn struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(tool["function"], &fn); err != nil || fn.Name == "" {
				return nil, 0, badRequest("tools", "tools[%d]: want {\"type\": \"function\", \"function\": {\"name\": ..., ...}}", i)
			}
		}
		out["tools"] = tools
		size += len(tools)
	}
	for i := range msgs {
		for j := range msgs[i].ToolCalls {
			tc := &msgs[i].ToolCalls[j]
			param := fmt.Sprintf("messages[%d].tool_calls[%d]", i, j)
			if tc.Type == "" {
				tc.Type = "function"
			}
			if tc.Type != "function" || tc.Function.Name == "" {
				return nil, 0, badRequest(param, "%s: want {\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}}", param)
			}
			args, err := tc.Function.ObjectArguments()
			if err != nil {
				return nil, 0, badRequest(param, "%s: %v", param, err)
			}
			tc.Function.Arguments = args
			size += len(tc.ID) + len(tc.Function.Name) + len(args)
		}
		size += len(msgs[i].ToolCallID) + len(msgs[i].Name)
	}
	return out, size, nil
}

// present is whether a raw JSON field was sent with a value other than null.
func present(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}
