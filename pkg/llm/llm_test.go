package llm

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestObjectArguments(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{in: `{"b": 1, "a": [2]}`, want: `{"b": 1, "a": [2]}`},
		{in: ` {"a":1} `, want: `{"a":1}`},
		{in: `"{\"b\": 1, \"a\": \"x\"}"`, want: `{"b": 1, "a": "x"}`}, // OpenAI's string form
		{in: ``, want: `{}`},
		{in: `null`, want: `{}`},
		{in: `"not json"`, err: "must be a JSON object"},
		{in: `"[1, 2]"`, err: "must be a JSON object"},
		{in: `[1]`, err: "must be a JSON object"},
		{in: `{"a": }`, err: "must be a JSON object"},
		{in: `"unterminated`, err: "arguments"},
	} {
		got, err := FunctionCall{Name: "f", Arguments: json.RawMessage(c.in)}.ObjectArguments()
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), `"f"`) {
				t.Errorf("ObjectArguments(%s) = %s, %v; want an error naming f and saying %q", c.in, got, err, c.err)
			}
		case err != nil || string(got) != c.want:
			t.Errorf("ObjectArguments(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

// A chat request's messages decode into Message with OpenAI's field names, and write back the same.
func TestMessageJSON(t *testing.T) {
	in := `[{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},` +
		`{"role":"tool","content":"2","tool_call_id":"call_1","name":"f"},{"role":"user","content":"hi"}]`
	var msgs []Message
	if err := json.Unmarshal([]byte(in), &msgs); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 3 || msgs[0].Content != "" || len(msgs[0].ToolCalls) != 1 || msgs[0].ToolCalls[0].ID != "call_1" ||
		msgs[0].ToolCalls[0].Function.Name != "f" || string(msgs[0].ToolCalls[0].Function.Arguments) != `"{\"x\": 1}"` ||
		msgs[1].ToolCallID != "call_1" || msgs[1].Name != "f" || msgs[2].ToolCalls != nil {
		t.Fatalf("decoded %+v", msgs)
	}
	out, err := json.Marshal(msgs[1:])
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"role":"tool","content":"2","tool_call_id":"call_1","name":"f"},{"role":"user","content":"hi"}]`; string(out) != want {
		t.Errorf("encoded %s, want %s", out, want)
	}
}
