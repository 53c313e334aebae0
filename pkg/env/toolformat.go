package env

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/drmas/drmas/pkg/llm"
)

// toolParser returns the parser of a tool-call format. TEMPORARY bridge until pkg/toolcall lands.
func toolParser(format string) (ToolParser, error) {
	if format != "" && format != "hermes" {
		return nil, fmt.Errorf("unknown tool-call format %q", format)
	}
	return func(resp string) (string, []llm.ToolCall, error) {
		var calls []llm.ToolCall
		var content strings.Builder
		rest := resp
		for {
			i := strings.Index(rest, "<tool_call>")
			if i < 0 {
				content.WriteString(rest)
				break
			}
			content.WriteString(rest[:i])
			rest = rest[i+len("<tool_call>"):]
			j := strings.Index(rest, "</tool_call>")
			if j < 0 {
				return "", nil, errors.New("unclosed <tool_call>")
			}
			var c struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			}
			if err := json.Unmarshal([]byte(strings.TrimSpace(rest[:j])), &c); err != nil {
				return "", nil, fmt.Errorf("invalid JSON in <tool_call>: %v", err)
			}
			if c.Name == "" {
				return "", nil, errors.New("tool call without a name")
			}
			calls = append(calls, llm.ToolCall{Type: "function", Function: llm.FunctionCall{Name: c.Name, Arguments: c.Arguments}})
			rest = rest[j+len("</tool_call>"):]
		}
		return strings.TrimSpace(content.String()), calls, nil
	}, nil
}
