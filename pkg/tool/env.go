package tool

import (
	"context"
	"encoding/json"

	"github.com/drmas/drmas/pkg/env"
)

// The Box is a flow's env.Toolbox: Specs and Run below.

// Specs returns the definitions of the named tools as a chat template's `tools` list takes them; an
// unknown name is an error naming what the box holds.
func (b *Box) Specs(names []string) ([]map[string]any, error) {
	sub, err := b.For(names...)
	if err != nil {
		return nil, err
	}
	return sub.Definitions(), nil
}

// Run runs one call for an episode of task: a failed call (unknown tool, arguments, the tool's error,
// timeout) is an *env.ToolError the agent is told about; an error of the Box (a server that died and
// could not be restarted, a tool unreachable through all tries) ends the rollout.
func (b *Box) Run(ctx context.Context, task *env.Task, name string, args json.RawMessage) (string, error) {
	res, err := b.Call(ctx, Call{Name: name, Arguments: args, Task: task})
	if err != nil {
		return "", err
	}
	if !res.OK() {
		return "", &env.ToolError{Reason: res.Reason}
	}
	return res.Text, nil
}
