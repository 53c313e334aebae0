package tool

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/env"
)

// drmas's built-in tools run through a Box as a flow's Toolbox: checked against their schemas,
// their failures told to the agent as *env.ToolError, their answers those of env.BuiltinTools.
func TestBuiltinsAsToolbox(t *testing.T) {
	tools, err := Builtins(env.BuiltinTools{Retriever: env.FactRetriever{}, TopK: 1}, env.ToolLookup, env.ToolSearch)
	if err != nil {
		t.Fatal(err)
	}
	box, err := New(Settings{MaxResultChars: 100}, tools...)
	if err != nil {
		t.Fatal(err)
	}
	tb := box.Toolbox()
	specs, err := tb.Specs([]string{env.ToolSearch})
	if err != nil || len(specs) != 1 || specs[0]["function"].(map[string]any)["name"] != env.ToolSearch {
		t.Fatalf("specs %v, %v", specs, err)
	}
	if _, err := tb.Specs([]string{"calculator"}); err == nil {
		t.Error("an unknown tool's spec: no error")
	}
	task := &env.Task{Question: "c?", Facts: []string{"a=1", "c=7"}}
	ctx := context.Background()
	for _, c := range []struct {
		name, args, want string
		fails            bool
	}{
		{env.ToolLookup, `{"key": "c"}`, "c=7", false},
		{env.ToolSearch, `{"query": "c"}`, "Doc 1: c=7", false},
		{env.ToolLookup, `{"key": "z"}`, `no fact for key "z"`, true},
		{env.ToolLookup, `{"key": 3}`, "arguments do not match the schema", true}, // the schema, before the tool
		{env.ToolLookup, `{}`, "missing properties", true},
		{"calculator", `{}`, `unknown tool "calculator"`, true},
	} {
		got, err := tb.Call(ctx, task, c.name, json.RawMessage(c.args))
		var te *env.ToolError
		switch {
		case c.fails && (!errors.As(err, &te) || !strings.Contains(te.Reason, c.want)):
			t.Errorf("%s %s: %q, %v; want a tool error with %q", c.name, c.args, got, err, c.want)
		case !c.fails && (err != nil || got != c.want):
			t.Errorf("%s %s: %q, %v; want %q", c.name, c.args, got, err, c.want)
		}
	}
	// A call without a task cannot run the built-ins: an error of the box, not the agent's.
	if _, err := box.Call(ctx, Call{Name: env.ToolLookup, Arguments: json.RawMessage(`{"key": "c"}`)}); err == nil {
		t.Error("a built-in call without a task: no error")
	}
}
