package serve

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy/policytest"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

func TestChatToolArgs(t *testing.T) {
	tools := json.RawMessage(`[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]`)
	msgs := []llm.Message{{Role: "user", Content: "u"},
		{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: "c1", Function: llm.FunctionCall{Name: "f", Arguments: json.RawMessage(`"{\"b\": 1, \"a\": 2}"`)}}}},
		{Role: "tool", Content: "r", ToolCallID: "c1", Name: "f"}}
	kw, size, err := chatToolArgs(msgs, tools, json.RawMessage(`"auto"`), map[string]json.RawMessage{"enable_thinking": json.RawMessage("false")})
	if err != nil {
		t.Fatal(err)
	}
	if string(kw["tools"].(json.RawMessage)) != string(tools) || string(kw["enable_thinking"].(json.RawMessage)) != "false" || len(kw) != 2 {
		t.Errorf("kwargs = %v", kw)
	}
	tc := msgs[1].ToolCalls[0]
	if tc.Type != "function" || string(tc.Function.Arguments) != `{"b": 1, "a": 2}` {
		t.Errorf("tool call = %+v %s, want type function and the object the string held", tc, tc.Function.Arguments)
	}
	if want := len(tools) + len("false") + len("c1") + len("f") + len(`{"b": 1, "a": 2}`) + len("c1") + len("f"); size != want {
		t.Errorf("size = %d, want %d", size, want)
	}
	if kw, size, err := chatToolArgs([]llm.Message{{Role: "user", Content: "u"}}, nil, nil, nil); kw != nil || size != 0 || err != nil {
		t.Errorf("no tools: %v %d %v", kw, size, err)
	}
	for _, c := range []struct {
		name       string
		msgs       []llm.Message
		tools      string
		choice     string
		kwargs     map[string]json.RawMessage
		param, msg string
	}{
		{name: "tool_choice required", choice: `"required"`, param: "tool_choice", msg: "not supported"},
		{name: "named tool_choice", choice: `{"type": "function", "function": {"name": "f"}}`, param: "tool_choice"},
		{name: "tools twice", tools: `[]`, kwargs: map[string]json.RawMessage{"tools": json.RawMessage(`[]`)}, param: "tools", msg: "both"},
		{name: "tools not a list", tools: `{"name": "f"}`, param: "tools", msg: "want a list"},
		{name: "tool without a name", tools: `[{"type": "function", "function": {}}]`, param: "tools", msg: "tools[0]"},
		{name: "arguments not an object", param: "messages[0].tool_calls[0]", msg: "must be a JSON object",
			msgs: []llm.Message{{Role: "assistant", ToolCalls: []llm.ToolCall{{Function: llm.FunctionCall{Name: "f", Arguments: json.RawMessage(`"x=1"`)}}}}}},
		{name: "call without a name", param: "messages[1].tool_calls[0]",
			msgs: []llm.Message{{Role: "user"}, {Role: "assistant", ToolCalls: []llm.ToolCall{{Function: llm.FunctionCall{Arguments: json.RawMessage(`{}`)}}}}}},
		{name: "call of another type", param: "messages[0].tool_calls[0]",
			msgs: []llm.Message{{Role: "assistant", ToolCalls: []llm.ToolCall{{Type: "retrieval", Function: llm.FunctionCall{Name: "f"}}}}}},
	} {
		_, _, err := chatToolArgs(c.msgs, json.RawMessage(c.tools), json.RawMessage(c.choice), c.kwargs)
		ae, ok := err.(*apiError)
		if !ok || ae.status != 400 || ae.param != c.param || !strings.Contains(ae.msg, c.msg) {
			t.Errorf("%s: %v, want a 400 on %s saying %q", c.name, err, c.param, c.msg)
		}
	}
}

// A chat with tools and tool messages is rendered through the model's template as transformers
// would render it (the tools in the client's key order, OpenAI's string arguments as the object
// they hold), not with the tools dropped; a built-in template refuses tools instead of ignoring
// them.
func TestChatWithTools(t *testing.T) {
	qwen3, err := tokenizer.LoadChatTemplate(filepath.Join("..", "policy", "tokenizer", "testdata", "models", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	// serverWith serves the toy model with chat as its template (nil: its own, a built-in).
	serverWith := func(chat *tokenizer.ChatTemplate) (*httptest.Server, *tokenizer.Tokenizer) {
		p := policytest.Load(t, toyDir)
		if chat != nil {
			p.Chat = chat
		}
		s, err := New(p, toyDir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		hs := httptest.NewServer(s.Handler())
		t.Cleanup(func() { hs.Close(); cancel(); <-done })
		return hs, p.Tok
	}
	hs, tok := serverWith(qwen3)

	tools := `[{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}}}]`
	body := `{"max_tokens": 2, "seed": 1, "tools": ` + tools + `, "tool_choice": "auto", "messages": [
		{"role": "user", "content": "2+3?"},
		{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"b\": 3, \"a\": 2}"}}]},
		{"role": "tool", "content": "5", "tool_call_id": "c1"}]}`
	code, r := call(t, hs.URL+"/v1/chat/completions", "", json.RawMessage(body))
	if code != 200 {
		t.Fatalf("HTTP %d: %v", code, r)
	}
	want := "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
		`{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}}}` +
		"\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
		"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"b\": 3, \"a\": 2}}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
	rendered, err := qwen3.RenderWith([]llm.Message{{Role: "user", Content: "2+3?"},
		{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: "c1", Type: "function", Function: llm.FunctionCall{Name: "add", Arguments: json.RawMessage(`{"b": 3, "a": 2}`)}}}},
		{Role: "tool", Content: "5", ToolCallID: "c1"}}, true, map[string]any{"tools": json.RawMessage(tools)})
	if err != nil || rendered != want {
		t.Fatalf("the template renders %q (%v),\nwant %q", rendered, err, want)
	}
	usage := r["usage"].(map[string]any)
	if got, n := int(usage["prompt_tokens"].(float64)), len(tok.Encode(want)); got != n {
		t.Errorf("prompt_tokens = %d, want %d (the conversation rendered with its tools)", got, n)
	}

	if code, r := call(t, hs.URL+"/v1/chat/completions", "", map[string]any{"messages": chatMsgs, "tool_choice": "required"}); code != 400 ||
		r["error"].(map[string]any)["param"] != "tool_choice" {
		t.Errorf("tool_choice required: %d %v, want a 400 on tool_choice", code, r)
	}

	hs, _ = serverWith(nil)
	code, r = call(t, hs.URL+"/v1/chat/completions", "", map[string]any{"messages": chatMsgs, "tools": json.RawMessage(tools), "max_tokens": 2})
	if code != 400 || !strings.Contains(r["error"].(map[string]any)["message"].(string), "cannot render tools") {
		t.Errorf("tools with a built-in template: %d %v, want a 400 saying it cannot render them", code, r)
	}
}
