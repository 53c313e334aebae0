package env

import (
	"fmt"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/toolcall"
)

// ToolFormats are the values of agents[].tool_format ("" = hermes when the agent's model family
// names none; pkg/config resolves it from the family).
var ToolFormats = []string{string(toolcall.Hermes), string(toolcall.Llama3JSON)}

// toolParser returns the parser of a tool-call format.
func toolParser(format string) (ToolParser, error) {
	f := toolcall.Format(format)
	switch f {
	case "":
		f = toolcall.Hermes
	case toolcall.Hermes, toolcall.Llama3JSON:
	default:
		return nil, fmt.Errorf("unknown tool-call format %q (%s or %s)", format, toolcall.Hermes, toolcall.Llama3JSON)
	}
	return func(resp string) (string, []llm.ToolCall, error) {
		r, err := toolcall.Parse(f, resp)
		if err != nil {
			return "", nil, err
		}
		return r.Content, toolcall.ToolCalls(r.Calls, nil), nil
	}, nil
}
