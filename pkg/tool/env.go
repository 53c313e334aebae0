package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/drmas/drmas/pkg/env"
)

// Builtins wraps drmas's own tools (env.BuiltinTools: lookup, search) as Tools of a Box, so that
// their calls are checked, bounded and cut like an MCP server's. Each call's task comes from
// WithTask; a call without one is refused.
func Builtins(b env.BuiltinTools, names ...string) ([]Tool, error) {
	specs, err := b.Specs(names)
	if err != nil {
		return nil, err
	}
	out := make([]Tool, len(specs))
	for i, s := range specs {
		fn, _ := s["function"].(map[string]any)
		name, _ := fn["name"].(string)
		desc, _ := fn["description"].(string)
		params, _ := fn["parameters"].(map[string]any)
		out[i] = Tool{Name: name, Description: desc, Parameters: params,
			Run: func(ctx context.Context, args json.RawMessage) (Output, error) {
				task, ok := ctx.Value(taskKey{}).(*env.Task)
				if !ok {
					return Output{}, stopped(fmt.Errorf("tool %s: the call carries no task (tool.WithTask)", name))
				}
				text, err := b.Call(ctx, task, name, args)
				var te *env.ToolError
				if errors.As(err, &te) {
					return Output{Text: te.Reason, IsError: true}, nil
				}
				return Output{Text: text}, err
			}}
	}
	return out, nil
}

type taskKey struct{}

// WithTask returns ctx carrying the episode's task, for the built-in tools.
func WithTask(ctx context.Context, t *env.Task) context.Context {
	return context.WithValue(ctx, taskKey{}, t)
}

// Toolbox is the Box as a flow's env.Toolbox: a failed call (unknown tool, arguments, the tool's
// error, timeout) is an *env.ToolError the agent is told about; an error of the Box (a server that
// died and could not be restarted, a tool unreachable through all tries) ends the rollout.
func (b *Box) Toolbox() env.Toolbox { return envBox{b} }

type envBox struct{ b *Box }

func (e envBox) Specs(names []string) ([]map[string]any, error) {
	sub, err := e.b.For(names...)
	if err != nil {
		return nil, err
	}
	return sub.Definitions(), nil
}

func (e envBox) Call(ctx context.Context, task *env.Task, name string, args json.RawMessage) (string, error) {
	res, err := e.b.Call(WithTask(ctx, task), Call{Name: name, Arguments: args})
	if err != nil {
		return "", err
	}
	if !res.OK() {
		return "", &env.ToolError{Reason: res.Reason}
	}
	return res.Text, nil
}
