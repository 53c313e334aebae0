package toolcall

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

// call is a Call for the tables.
func call(name, args string) Call { return Call{Name: name, Arguments: json.RawMessage(args)} }

type parseCase struct {
	name    string
	text    string
	calls   []Call
	content string
	reason  Reason // "" for a valid response
	callIdx int    // the call the error concerns
	offset  int    // where that call starts; -1: not checked
	detail  string // a part of the error's detail
}

func runParse(t *testing.T, f Format, cases []parseCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Parse(f, c.text)
			if c.reason != "" {
				var pe *Error
				if !errors.As(err, &pe) {
					t.Fatalf("Parse(%q) = %+v, %v; want an *Error with reason %q", c.text, res, err, c.reason)
				}
				if pe.Reason != c.reason || pe.Call != c.callIdx || pe.Format != f || (c.offset >= 0 && pe.Offset != c.offset) {
					t.Errorf("Parse(%q): error %+v; want reason %q, call %d, offset %d", c.text, pe, c.reason, c.callIdx, c.offset)
				}
				if !strings.Contains(pe.Error(), c.detail) || !strings.Contains(pe.Error(), string(c.reason)) {
					t.Errorf("Parse(%q): error %q does not say %q and %q", c.text, pe, c.reason, c.detail)
				}
				if res.Calls != nil || res.Content != "" {
					t.Errorf("Parse(%q): a malformed response gave %+v; want nothing", c.text, res)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", c.text, err)
			}
			if !reflect.DeepEqual(res.Calls, c.calls) {
				t.Errorf("Parse(%q) calls:\n got  %s\n want %s", c.text, show(res.Calls), show(c.calls))
			}
			if res.Content != c.content {
				t.Errorf("Parse(%q) content = %q, want %q", c.text, res.Content, c.content)
			}
		})
	}
}

func show(calls []Call) string {
	var parts []string
	for _, c := range calls {
		parts = append(parts, fmt.Sprintf("%s(%s)", c.Name, c.Arguments))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func TestParseHermes(t *testing.T) {
	runParse(t, Hermes, []parseCase{
		{name: "no call", text: "  The answer is 4.\n", content: "The answer is 4."},
		{name: "empty", text: ""},
		{name: "one call as Qwen writes it",
			text:  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": 2}}\n</tool_call>",
			calls: []Call{call("get_weather", `{"location": "Paris", "days": 2}`)}},
		{name: "two calls with text around them",
			text: "Let me look both up.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": null}]}}\n</tool_call>\n" +
				"<tool_call>{\"arguments\":{},\"name\":\"b\"}</tool_call>\nDone.",
			calls:   []Call{call("a", `{"x": [1, {"y": null}]}`), call("b", `{}`)},
			content: "Let me look both up.\nDone."},
		{name: "arguments keep their order and spacing",
			text:  "<tool_call>{\"name\": \"f\", \"arguments\": {\"z\":1,  \"a\": \"</tool_call\"}}</tool_call>",
			calls: []Call{call("f", `{"z":1,  "a": "</tool_call"}`)}},
		{name: "no arguments is an empty object",
			text: "<tool_call>{\"name\": \"now\"}</tool_call>", calls: []Call{call("now", `{}`)}},
		{name: "unicode and escapes", text: "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"中文 \\\"é\\\" 😀\"}}\n</tool_call>",
			calls: []Call{call("search", `{"q": "中文 \"é\" 😀"}`)}},

		{name: "unclosed tag", text: "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
			reason: UnclosedTag, callIdx: 0, offset: 3, detail: "without </tool_call>"},
		{name: "second call unclosed",
			text:   "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\"}",
			reason: UnclosedTag, callIdx: 1, offset: 36},
		{name: "tag opened twice", text: "<tool_call>{\"name\": \"f\"<tool_call>{\"name\": \"g\"}</tool_call>",
			reason: UnclosedTag, callIdx: 0, offset: 0, detail: "another <tool_call> opens"},
		{name: "stray closing tag", text: "text</tool_call>", reason: StrayTag, callIdx: 0, offset: 4},
		{name: "stray closing tag after a call",
			text:   "<tool_call>{\"name\": \"f\"}</tool_call> and </tool_call>",
			reason: StrayTag, callIdx: 1, offset: 41},
		{name: "invalid JSON", text: "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }}\n</tool_call>",
			reason: InvalidJSON, callIdx: 0, offset: 0, detail: "invalid character '}'"},
		{name: "JSON cut short", text: "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}</tool_call>",
			reason: InvalidJSON, offset: 0, detail: "ends early"},
		{name: "text after the JSON", text: "<tool_call>{\"name\": \"f\"} extra</tool_call>",
			reason: InvalidJSON, offset: 0, detail: "text after the JSON value"},
		{name: "empty call", text: "<tool_call>\n \n</tool_call>", reason: InvalidJSON, offset: 0, detail: "empty call"},
		{name: "not an object", text: "<tool_call>[\"f\", {}]</tool_call>", reason: NotAnObject, offset: 0},
		{name: "missing name", text: "<tool_call>{\"arguments\": {}}</tool_call>", reason: MissingName, offset: 0, detail: `no "name"`},
		{name: "empty name", text: "<tool_call>{\"name\": \" \", \"arguments\": {}}</tool_call>", reason: MissingName, offset: 0},
		{name: "name not a string", text: "<tool_call>{\"name\": 3}</tool_call>", reason: NameNotString, offset: 0},
		{name: "arguments a string", text: "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
			reason: ArgumentsNotObject, offset: 0, detail: `"arguments" of f`},
		{name: "arguments null", text: "<tool_call>{\"name\": \"f\", \"arguments\": null}</tool_call>",
			reason: ArgumentsNotObject, offset: 0},
		{name: "second call malformed", text: "<tool_call>{\"name\": \"f\"}</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": [1]}</tool_call>",
			reason: ArgumentsNotObject, callIdx: 1, offset: 37},
	})
}

func TestParseLlama3JSON(t *testing.T) {
	runParse(t, Llama3JSON, []parseCase{
		{name: "plain answer", text: "The capital is Paris.", content: "The capital is Paris."},
		{name: "answer starting with a brace", text: "{x | x > 2} is a set.", content: "{x | x > 2} is a set."},
		{name: "call as the template asks",
			text:  `{"name": "get_weather", "parameters": {"location": "Paris", "unit": "celsius"}}`,
			calls: []Call{call("get_weather", `{"location": "Paris", "unit": "celsius"}`)}},
		{name: "call after python_tag",
			text:  `<|python_tag|>{"name": "search", "parameters": {"query": "x"}}`,
			calls: []Call{call("search", `{"query": "x"}`)}},
		{name: "text before python_tag",
			text:    "Let me check.\n<|python_tag|>{\"name\": \"search\", \"parameters\": {}}",
			calls:   []Call{call("search", `{}`)},
			content: "Let me check."},
		{name: "arguments instead of parameters", text: ` {"name": "f", "arguments": {"a": 1}} `,
			calls: []Call{call("f", `{"a": 1}`)}},
		{name: "several calls separated by semicolons",
			text:  `<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}};`,
			calls: []Call{call("a", `{"x": 1}`), call("b", `{}`)}},

		{name: "invalid JSON", text: `{"name": "f", "parameters": {"x": 1}`, reason: InvalidJSON, offset: 0, detail: "ends early"},
		{name: "invalid JSON after python_tag", text: `<|python_tag|>{"name": f}`, reason: InvalidJSON, offset: 14,
			detail: "invalid character"},
		{name: "missing name", text: `{"function": "f", "parameters": {}}`, reason: MissingName, offset: 0},
		{name: "parameters not an object", text: `{"name": "f", "parameters": "x=1"}`, reason: ArgumentsNotObject, offset: 0,
			detail: `"parameters" of f`},
		{name: "text after the call", text: `{"name": "f", "parameters": {}} I called f.`, reason: TrailingText, callIdx: 0,
			offset: 32, detail: "I called f."},
		{name: "built-in tool call", text: `<|python_tag|>brave_search.call(query="x")`, reason: NotJSONCall, offset: 14,
			detail: "built-in tool calls"},
		{name: "nothing after python_tag", text: "<|python_tag|>  ", reason: NotJSONCall, offset: 16},
		{name: "second call malformed", text: `{"name": "a", "parameters": {}}; {"parameters": {}}`, reason: MissingName,
			callIdx: 1, offset: 33},
	})
}

func TestParseUnknownFormat(t *testing.T) {
	if _, err := Parse("mistral", "[TOOL_CALLS]"); err == nil || !strings.Contains(err.Error(), "hermes") {
		t.Errorf("Parse with an unknown format: %v, want an error naming the known ones", err)
	}
}

func TestFormatFor(t *testing.T) {
	for name, want := range map[string]Format{
		"Qwen3-8B": Hermes, "Qwen2.5-7B-Instruct": Hermes, "Qwen/Qwen3-0.6B": Hermes, "QwQ-32B": Hermes,
		"NousResearch/Hermes-3-Llama-3.1-8B": Hermes, tokenizer.TemplateChatML: Hermes, tokenizer.TemplateQwen3: Hermes,
		"llama3.1": Llama3JSON, "meta-llama/Llama-3.2-1B-Instruct": Llama3JSON, "Llama-3.3-70B": Llama3JSON,
		tokenizer.TemplateLlama3: Llama3JSON,
	} {
		got, err := FormatFor(name)
		if err != nil || got != want {
			t.Errorf("FormatFor(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"mistral", "llama2", "", "plain"} {
		if f, err := FormatFor(name); err == nil {
			t.Errorf("FormatFor(%q) = %q, want an error", name, f)
		}
	}
}

// templateSource reads the chat template of a test model folder of pkg/policy/tokenizer.
func templateSource(t *testing.T, model string) *tokenizer.ChatTemplate {
	t.Helper()
	ct, err := tokenizer.LoadChatTemplate(filepath.Join("..", "policy", "tokenizer", "testdata", "models", model))
	if err != nil {
		t.Fatal(err)
	}
	return ct
}

func TestFormatForTemplate(t *testing.T) {
	for model, want := range map[string]Format{"qwen3": Hermes, "qwen2.5": Hermes, "llama3.1": Llama3JSON} {
		if got, ok := FormatForTemplate(templateSource(t, model).Source()); !ok || got != want {
			t.Errorf("%s: FormatForTemplate = %q, %v; want %q", model, got, ok, want)
		}
	}
	for _, model := range []string{"llama3", "mistral"} {
		if got, ok := FormatForTemplate(templateSource(t, model).Source()); ok {
			t.Errorf("%s: FormatForTemplate = %q, want none", model, got)
		}
	}
}

// The inverse: a response parsed and turned into the assistant message renders, through the
// model's own template, as the model wrote it (in the template's canonical spacing).
func TestMessageRendersBack(t *testing.T) {
	cases := []struct {
		model, text string
		format      Format
		ids         func(int) string
	}{
		{"qwen3", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"opts\": {\"days\": 2, \"hourly\": false}}}\n</tool_call>\n" +
			"<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"é & <b>\"}}\n</tool_call>", Hermes, nil},
		{"qwen3", "I will search.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\", \"a\": 1.5}}\n</tool_call>", Hermes, nil},
		{"qwen2.5", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"z\": [1, 2], \"a\": null}}\n</tool_call>", Hermes,
			func(i int) string { return fmt.Sprintf("call_%d", i) }},
		{"llama3.1", `{"name": "search", "parameters": {"query": "capital", "filters": {"year": 2024}}}`, Llama3JSON, nil},
	}
	for _, c := range cases {
		ct := templateSource(t, c.model)
		res, err := Parse(c.format, c.text)
		if err != nil {
			t.Fatal(err)
		}
		msg := res.Message(c.ids)
		if msg.Role != "assistant" || len(msg.ToolCalls) != len(res.Calls) {
			t.Fatalf("%s: Message = %+v", c.model, msg)
		}
		for i, tc := range msg.ToolCalls {
			if tc.Type != "function" || tc.Function.Name != res.Calls[i].Name || (c.ids != nil && tc.ID != c.ids(i)) {
				t.Errorf("%s: tool_calls[%d] = %+v", c.model, i, tc)
			}
		}
		conv := []llm.Message{{Role: "user", Content: "Go."}, msg}
		for _, tc := range msg.ToolCalls {
			conv = append(conv, ResultMessage(tc, "result of "+tc.Function.Name))
		}
		kwargs := map[string]any{"tools": json.RawMessage(`[{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]`)}
		prompt, err := ct.RenderWith(conv, true, kwargs)
		if err != nil {
			t.Fatalf("%s: %v", c.model, err)
		}
		if !strings.Contains(prompt, c.text) {
			t.Errorf("%s: the rendered prompt does not hold the response as written:\n prompt   %q\n response %q", c.model, prompt, c.text)
		}
		// The next turn's prompt holds the tool results where the template puts them.
		for _, tc := range msg.ToolCalls {
			if !strings.Contains(prompt, "result of "+tc.Function.Name) {
				t.Errorf("%s: prompt lacks the result of %s: %q", c.model, tc.Function.Name, prompt)
			}
		}
	}
}

func TestResultMessage(t *testing.T) {
	tc := llm.ToolCall{ID: "a1b2c3d4e", Type: "function", Function: llm.FunctionCall{Name: "f", Arguments: json.RawMessage(`{}`)}}
	got := ResultMessage(tc, "42")
	want := llm.Message{Role: "tool", Content: "42", ToolCallID: "a1b2c3d4e", Name: "f"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ResultMessage = %+v, want %+v", got, want)
	}
	if ToolCalls(nil, nil) != nil {
		t.Error("ToolCalls(nil) is not nil: a message without calls must have no tool_calls field")
	}
}

// A key given twice in a call's object, at any depth, is a malformed call naming the key (before: the
// last "name" was taken, and an argument given twice passed the schema check on one value while a
// server reading the first got the other).
func TestDuplicateKeysRefused(t *testing.T) {
	runParse(t, Hermes, []parseCase{
		{name: "two names", text: `<tool_call>{"name": "lookup", "name": "delete_all", "arguments": {}}</tool_call>`,
			reason: DuplicateKey, offset: 0, detail: `"name" appears twice`},
		{name: "two arguments", text: `<tool_call>{"name": "a", "arguments": {"x": 1}, "arguments": {"x": 2}}</tool_call>`,
			reason: DuplicateKey, offset: 0, detail: `"arguments" appears twice`},
		{name: "an argument twice", text: `ok <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call><tool_call>{"name": "a", "arguments": {"x": "s", "x": 1}}</tool_call>`,
			reason: DuplicateKey, callIdx: 1, offset: -1, detail: `"arguments.x" appears twice`},
		{name: "deep", text: `<tool_call>{"name": "a", "arguments": {"q": [{"k": 1}, {"k": 2, "k": 3}]}}</tool_call>`,
			reason: DuplicateKey, offset: 0, detail: `"arguments.q[1].k" appears twice`},
		{name: "same key in sibling objects", text: `<tool_call>{"name": "a", "arguments": {"p": {"k": 1}, "q": {"k": 2}}}</tool_call>`,
			calls: []Call{call("a", `{"p": {"k": 1}, "q": {"k": 2}}`)}},
	})
	runParse(t, Llama3JSON, []parseCase{
		{name: "two names", text: `{"name": "lookup", "parameters": {}, "name": "x"}`, reason: DuplicateKey, offset: 0, detail: `"name" appears twice`},
		{name: "two parameters", text: `<|python_tag|>{"name": "a", "parameters": {"k": "c", "k": "d"}}`, reason: DuplicateKey, offset: -1, detail: `"parameters.k" appears twice`},
	})
}
