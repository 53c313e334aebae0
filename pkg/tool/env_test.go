package tool

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
)

// drmas's built-in tools run through a Box as a flow's Toolbox: checked against their schemas,
// their failures told to the agent as *env.ToolError; lookup reads the call's task's facts, search
// the retriever's documents.
func TestBuiltinsAsToolbox(t *testing.T) {
	box, err := New(Settings{MaxResultChars: 100}, Builtins{Retriever: env.FactRetriever{}, TopK: 1}.tools()...)
	if err != nil {
		t.Fatal(err)
	}
	var tb env.Toolbox = box
	specs, err := tb.Specs([]string{Search})
	if err != nil || len(specs) != 1 || specs[0]["function"].(map[string]any)["name"] != Search {
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
		{Lookup, `{"key": "c"}`, "c=7", false},
		{Search, `{"query": "c"}`, "Doc 1: c=7", false},
		{Lookup, `{"key": "z"}`, `no fact for key "z"`, true},
		{Lookup, `{"key": 3}`, "arguments do not match the schema", true}, // the schema, before the tool
		{Lookup, `{}`, "missing properties", true},
		{"calculator", `{}`, `unknown tool "calculator"`, true},
	} {
		got, err := tb.Run(ctx, task, c.name, json.RawMessage(c.args))
		var te *env.ToolError
		switch {
		case c.fails && (!errors.As(err, &te) || !strings.Contains(te.Reason, c.want)):
			t.Errorf("%s %s: %q, %v; want a tool error with %q", c.name, c.args, got, err, c.want)
		case !c.fails && (err != nil || got != c.want):
			t.Errorf("%s %s: %q, %v; want %q", c.name, c.args, got, err, c.want)
		}
	}
	// A call without a task cannot run the built-ins: an error of the box, not the agent's.
	if _, err := box.Call(ctx, Call{Name: Lookup, Arguments: json.RawMessage(`{"key": "c"}`)}); err == nil {
		t.Error("a built-in call without a task: no error")
	}
}

// The built-in search in a flow: a step's agent searches the retriever for its task and answers from
// the document; a box opened without a retriever has no search, and a step naming it is refused.
func TestBuiltinSearchInAFlow(t *testing.T) {
	cfg := env.OrchestraConfig{Type: "flow", MaxTurns: 1, MaxLoopNum: 1, TopK: 1, Prompts: env.PromptsToy,
		Flow: env.FlowConfig{MaxCalls: 8, Answer: "answer", Match: env.MatchQA, Steps: []env.FlowStep{
			{Agent: "answerer", Tag: "answer", Tools: []string{Search}}}}}
	agents := []env.AgentConfig{{Name: "answerer", Model: "m"}}
	bare, err := Open(context.Background(), Config{}, &Builtins{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.NewOrchestra(cfg, agents, nil, env.WithTools(bare)); err == nil || !strings.Contains(err.Error(), `no tool "search"`) {
		t.Fatalf("search without a retriever: %v", err)
	}
	box, err := Open(context.Background(), Config{}, &Builtins{Retriever: env.FactRetriever{}, TopK: 1})
	if err != nil {
		t.Fatal(err)
	}
	o, err := env.NewOrchestra(cfg, agents, env.FactRetriever{}, env.WithTools(box))
	if err != nil {
		t.Fatal(err)
	}
	gen := scripted(func(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
		out := make([]llm.Completion, len(reqs))
		for i, r := range reqs {
			text := `<tool_call>{"name": "search", "arguments": {"query": "c"}}</tool_call>`
			if m := r.Messages[len(r.Messages)-1]; m.Role == "tool" {
				text = "<answer>" + strings.TrimPrefix(m.Content, "Doc 1: c=") + "</answer>"
			}
			out[i] = llm.Completion{Text: text, PromptIDs: []int{1}, ResponseIDs: []int{2}, LogProbs: []float32{-1}, Finish: llm.FinishStop}
		}
		return out, nil
	})
	tasks := []env.Task{{ID: "q1", Question: "c?", Answers: []string{"7"}, Facts: []string{"a=1", "c=7"}, Support: []string{"c=7"}}}
	r, err := o.Run(context.Background(), gen, tasks, 1, env.RunOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if tr := r.Trajectories[0]; tr.Reward != 1 || len(tr.Calls) != 2 || tr.Calls[0].Tools[0].Result != "Doc 1: c=7" {
		t.Errorf("search as a function tool: reward %g, calls %d, tool uses %+v", tr.Reward, len(tr.Calls), tr.Calls[0].Tools)
	}
}

// scripted is a Generator from a function.
type scripted func(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error)

func (f scripted) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	return f(ctx, reqs)
}
