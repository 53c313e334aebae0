package env

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// toolScript answers each request by a rule over the whole conversation and keeps the requests.
type toolScript struct {
	rule func(r llm.Request) string
	reqs []llm.Request
}

func (s *toolScript) Generate(_ context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		text := s.rule(r)
		out[i] = llm.Completion{Text: text, PromptIDs: []int{1, 2}, ResponseIDs: []int{3}, LogProbs: []float32{-0.5}, Finish: llm.FinishStop}
		s.reqs = append(s.reqs, r)
	}
	return out, nil
}

// lastTool is the content of the conversation's last tool message ("" when none).
func lastTool(r llm.Request) string {
	if m := r.Messages[len(r.Messages)-1]; m.Role == "tool" {
		return m.Content
	}
	return ""
}

// factTools is the tests' toolbox: lookup, a task's fact by its key, as pkg/tool's built-in of that
// name answers (without the Box's schema checks and bounds, which pkg/tool tests).
type factTools struct{}

func (factTools) Specs(names []string) ([]map[string]any, error) {
	var out []map[string]any
	for _, n := range names {
		if n != "lookup" {
			return nil, fmt.Errorf("unknown tool %q", n)
		}
		out = append(out, map[string]any{"type": "function", "function": map[string]any{"name": n, "description": "A fact by its key.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"key": map[string]any{"type": "string"}}}}})
	}
	return out, nil
}

func (factTools) Run(_ context.Context, task *Task, name string, args json.RawMessage) (string, error) {
	if name != "lookup" {
		return "", &ToolError{Reason: fmt.Sprintf("unknown tool %q", name)}
	}
	var a struct{ Key any }
	_ = json.Unmarshal(args, &a)
	key, ok := a.Key.(string)
	if !ok {
		return "", &ToolError{Reason: `argument "key": a string is required`}
	}
	for _, f := range task.Facts {
		if k, _, _ := strings.Cut(f, "="); k == key {
			return f, nil
		}
	}
	return "", &ToolError{Reason: fmt.Sprintf("no fact for key %q", key)}
}

func toolFlow(t *testing.T, maxToolCalls int) Orchestra {
	t.Helper()
	cfg := OrchestraConfig{Type: "flow", MaxTurns: 1, MaxLoopNum: 1, TopK: 1, Prompts: PromptsToy,
		Flow: FlowConfig{MaxCalls: 8, Answer: "answer", Match: MatchQA, Steps: []FlowStep{
			{Agent: "answerer", Tag: "answer", Tools: []string{"lookup"}, MaxToolCalls: maxToolCalls}}}}
	o, err := NewOrchestra(cfg, []AgentConfig{{Name: "answerer", Model: "m"}}, nil, WithTools(factTools{}))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

var toolTask = []Task{{ID: "q1", Question: "c?", Answers: []string{"7"}, Facts: []string{"a=1", "c=7"}, Support: []string{"c=7"}}}

// An agent calls the lookup tool, reads its result from the tool message and answers: two calls of
// the trajectory, the first with its tool use recorded, the second's prompt the whole conversation.
func TestFlowToolCallAndAnswer(t *testing.T) {
	o := toolFlow(t, 2)
	gen := &toolScript{rule: func(r llm.Request) string {
		if res := lastTool(r); res != "" {
			_, v, _ := strings.Cut(res, "=")
			return "<answer>" + v + "</answer>"
		}
		return `<tool_call>{"name": "lookup", "arguments": {"key": "c"}}</tool_call>`
	}}
	r, err := o.Run(context.Background(), gen, toolTask, 2, RunOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range r.Trajectories {
		checkTraj(t, tr, want{agents: []string{"answerer", "answerer"}, valid: []bool{true, true}, scores: []float64{1, 1}, reward: 1})
		use := tr.Calls[0].Tools
		if len(use) != 1 || use[0].Name != "lookup" || use[0].Result != "c=7" || use[0].Error != "" || string(use[0].Arguments) != `{"key": "c"}` {
			t.Errorf("%s: tool use %+v", tr.TrajUID, use)
		}
		msgs := tr.Calls[1].Messages
		if len(msgs) != 3 || msgs[0].Role != "user" || msgs[1].Role != "assistant" || len(msgs[1].ToolCalls) != 1 ||
			msgs[1].ToolCalls[0].ID == "" || msgs[2].Role != "tool" || msgs[2].Content != "c=7" || msgs[2].ToolCallID != msgs[1].ToolCalls[0].ID {
			t.Errorf("%s: second call's conversation %+v", tr.TrajUID, msgs)
		}
		if tr.Calls[0].RoleReward != 1 {
			t.Errorf("%s: the lookup that found the answer has role reward %g, want 1", tr.TrajUID, tr.Calls[0].RoleReward)
		}
		if tr.Calls[1].Turn != 1 {
			t.Errorf("%s: a tool turn advanced the turn to %d", tr.TrajUID, tr.Calls[1].Turn)
		}
	}
	tools, _ := gen.reqs[0].ChatTemplateKwargs["tools"].([]map[string]any)
	if len(tools) != 1 || tools[0]["function"].(map[string]any)["name"] != "lookup" {
		t.Errorf("the request's tools %v, want the lookup definition", gen.reqs[0].ChatTemplateKwargs["tools"])
	}
}

// Failed tool calls are invalid calls with their reason; the agent is told the error and goes on
// (unknown tool, bad arguments, a tool error), or its visit ends (a malformed call, a call past
// max_tool_calls).
func TestFlowToolFailures(t *testing.T) {
	cases := []struct {
		name      string
		responses []string // the agent's responses in turn
		valid     []bool
		reason    string // in the first invalid call's tool use
		reward    float64
	}{
		{"unknown tool", []string{`<tool_call>{"name": "nope", "arguments": {}}</tool_call>`, "<answer>7</answer>"},
			[]bool{false, true}, `unknown tool "nope"`, 1},
		{"bad arguments", []string{`<tool_call>{"name": "lookup", "arguments": {"key": 3}}</tool_call>`, "<answer>1</answer>"},
			[]bool{false, true}, `argument "key"`, 0},
		{"tool error", []string{`<tool_call>{"name": "lookup", "arguments": {"key": "z"}}</tool_call>`, "<answer>7</answer>"},
			[]bool{false, true}, `no fact for key "z"`, 1},
		{"malformed", []string{`<tool_call>{"name": "lookup", "arguments": </tool_call>`}, []bool{false}, "malformed tool call", 0},
		{"unclosed", []string{`<tool_call>{"name": "lookup"}`}, []bool{false}, "malformed tool call", 0},
		{"limit", []string{`<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>`,
			`<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>`,
			`<tool_call>{"name": "lookup", "arguments": {"key": "c"}}</tool_call>`}, []bool{true, true, false}, "max_tool_calls reached (2)", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := toolFlow(t, 2)
			gen := &toolScript{rule: func(r llm.Request) string { return pick(c.responses, (len(r.Messages)-1)/2) }}
			r, err := o.Run(context.Background(), gen, toolTask, 1, RunOptions{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			tr := r.Trajectories[0]
			agents := make([]string, len(c.valid))
			scores := make([]float64, len(c.valid))
			for i, v := range c.valid {
				agents[i], scores[i] = "answerer", c.reward
				if !v {
					scores[i] -= 0.1
				}
			}
			checkTraj(t, tr, want{agents: agents, valid: c.valid, scores: scores, reward: c.reward})
			for i, call := range tr.Calls {
				if !c.valid[i] {
					if len(call.Tools) == 0 || !strings.Contains(call.Tools[0].Error, c.reason) {
						t.Errorf("invalid call %d: tool uses %+v, want a reason with %q", i, call.Tools, c.reason)
					}
					break
				}
			}
			if tr.Calls[0].RoleReward != 0 {
				t.Errorf("a failed or malformed tool call has role reward %g, want 0", tr.Calls[0].RoleReward)
			}
			if strings.HasPrefix(c.name, "unknown") || strings.HasPrefix(c.name, "bad") || strings.HasPrefix(c.name, "tool") {
				if got := lastTool(gen.reqs[1]); !strings.HasPrefix(got, "error: ") || !strings.Contains(got, c.reason) {
					t.Errorf("the agent was told %q, want the error", got)
				}
			}
		})
	}
}

// A tool step naming a tool its toolbox lacks is refused when the orchestra is built, naming the
// step; so is a tool step without a toolbox.
func TestFlowUnknownToolRefused(t *testing.T) {
	cfg := OrchestraConfig{Type: "flow", MaxTurns: 1, MaxLoopNum: 1, TopK: 1, Prompts: PromptsToy,
		Flow: FlowConfig{MaxCalls: 8, Answer: "answer", Match: MatchQA, Steps: []FlowStep{
			{Agent: "answerer", Tag: "answer", Tools: []string{"lookup", "calculator"}}}}}
	_, err := NewOrchestra(cfg, []AgentConfig{{Name: "answerer", Model: "m"}}, nil, WithTools(factTools{}))
	if err == nil || !strings.Contains(err.Error(), `orchestra.flow.steps[0].tools: unknown tool "calculator"`) {
		t.Fatalf("err = %v", err)
	}
	cfg.Flow.Steps[0].Tools = []string{"lookup"}
	if _, err := NewOrchestra(cfg, []AgentConfig{{Name: "answerer", Model: "m"}}, nil); err == nil || !strings.Contains(err.Error(), "no toolbox") {
		t.Fatalf("a tool step without a toolbox: %v", err)
	}
}
