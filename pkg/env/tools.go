package env

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/drmas/drmas/pkg/llm"
)

// Function tools in a flow (docs/tools.md): a step's agent is rendered with the definitions of its
// tools (the chat template's `tools`), its response is parsed in its model family's tool-call format,
// each call runs and its result returns as a `tool` message, and the agent is called again until it
// answers without a call. Each of those calls is a call of the trajectory, trained on its own sampled
// tokens; the tool results are in the next call's prompt, context that is never trained on.

// ToolUse is one function call an agent's response made and what came of it (transcripts: tools).
type ToolUse struct {
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// Result is what returned to the agent as the tool message ("error: …" for a failed call).
	Result string `json:"result"`
	// Error says why the call failed (malformed call, unknown tool, arguments, the tool's own error,
	// timeout); a failed call makes the agent's call invalid.
	Error   string  `json:"error,omitempty"`
	Seconds float64 `json:"seconds"`
}

// Toolbox runs a team's function tools: pkg/tool's Box (drmas's own tools and MCP servers', every
// call bounded in size and time).
type Toolbox interface {
	// Specs returns the definitions of the named tools in OpenAI's form, as chat templates take them:
	// {"type": "function", "function": {"name", "description", "parameters"}}. An unknown name is an error.
	Specs(names []string) ([]map[string]any, error)
	// Call runs one call for an episode of task. A *ToolError is the call's failure, told to the agent
	// (the call is invalid); any other error ends the rollout (a server that cannot be reached).
	Run(ctx context.Context, task *Task, name string, args json.RawMessage) (string, error)
}

// ToolError is a failed tool call the agent is told about: unknown tool, arguments, the tool's own
// error, timeout.
type ToolError struct{ Reason string }

func (e *ToolError) Error() string { return e.Reason }

func toolError(format string, args ...any) error {
	return &ToolError{Reason: fmt.Sprintf(format, args...)}
}

// ToolParser reads a response in a tool-call format: the text outside the calls and the calls; an
// error names a malformed call.
type ToolParser func(response string) (content string, calls []llm.ToolCall, err error)

// toolTurn is an agent's visit that is calling tools: the conversation so far and its tool turns.
type toolTurn struct {
	convo []llm.Message
	turns int
}

// runTools runs the calls of each episode's latest response (calls[i] belongs to eps[i]) concurrently,
// records them on the call and returns the tool messages for each episode, in call order. An error
// that is not a *ToolError ends the rollout.
func (t *team) runTools(ctx context.Context, box Toolbox, eps []*episode, calls [][]llm.ToolCall) ([][]llm.Message, error) {
	out := make([][]llm.Message, len(eps))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fatal error
	for i, e := range eps {
		c := &e.traj.Calls[len(e.traj.Calls)-1]
		c.Tools = make([]ToolUse, len(calls[i]))
		out[i] = make([]llm.Message, len(calls[i]))
		for j, tc := range calls[i] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				began := time.Now()
				args, err := tc.Function.ObjectArguments()
				if err != nil {
					err = &ToolError{Reason: err.Error()}
				}
				res := ""
				if err == nil {
					res, err = box.Run(ctx, e.task, tc.Function.Name, args)
				}
				u := ToolUse{ID: tc.ID, Name: tc.Function.Name, Arguments: args, Result: res, Seconds: time.Since(began).Seconds()}
				var te *ToolError
				if err != nil && !errors.As(err, &te) {
					mu.Lock()
					fatal = cmp.Or(fatal, fmt.Errorf("tool %s: %w", tc.Function.Name, err))
					mu.Unlock()
				}
				if err != nil {
					u.Error = err.Error()
					u.Result = "error: " + u.Error
				}
				c.Tools[j] = u
				out[i][j] = llm.Message{Role: "tool", Content: u.Result, ToolCallID: tc.ID, Name: tc.Function.Name}
			}()
		}
	}
	wg.Wait()
	if fatal != nil {
		return nil, fatal
	}
	for _, e := range eps {
		c := &e.traj.Calls[len(e.traj.Calls)-1]
		if slices.ContainsFunc(c.Tools, func(u ToolUse) bool { return u.Error != "" }) {
			c.Valid = false
		}
		// The role reward of a tool turn, as a searcher's: a result holds what the task needs.
		var docs []Doc
		for _, u := range c.Tools {
			if u.Error == "" {
				docs = append(docs, Doc{Contents: u.Result})
			}
		}
		c.RoleReward = b2f(hit(e.task, docs))
	}
	return out, nil
}

// withIDs gives calls without an id one unique within the trajectory (call_<n>_<k>), as OpenAI's
// messages carry them.
func withIDs(calls []llm.ToolCall, n int) []llm.ToolCall {
	out := slices.Clone(calls)
	for k := range out {
		if out[k].ID == "" {
			out[k].ID = "call_" + strconv.Itoa(n) + "_" + strconv.Itoa(k)
		}
		if out[k].Type == "" {
			out[k].Type = "function"
		}
	}
	return out
}

// errToolLimit is the reason of a call that asked for tools after max_tool_calls.
var errToolLimit = errors.New("max_tool_calls reached")
