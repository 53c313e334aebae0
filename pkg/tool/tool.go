package tool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/drmas/drmas/pkg/env"
)

// Func runs a tool for an episode of task (nil outside one; MCP servers' tools do not read it) on
// arguments that passed its schema (a JSON object). Its Output is what the model sees; Output.IsError marks a failure the tool itself reported (bad input it detected, nothing found
// where something must be…), which is not tried again. An error means the tool could not be reached
// or did not answer (a transport failure): the Box tries the call again, up to its tries.
type Func func(ctx context.Context, task *env.Task, args json.RawMessage) (Output, error)

// Output is what a tool returned.
type Output struct {
	Text    string // the result as text for the model
	IsError bool   // the tool reported a failure; Text says what
}

// Tool is a function an agent may call.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON schema of the arguments object (draft 2020-12 or draft-07), as decoded
	// from JSON: {"type": "object", "properties": {...}, "required": [...]}. Nil means no arguments.
	Parameters map[string]any
	Run        Func
}

// namePattern is what a tool name may be: the characters every chat template and MCP accept.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// CheckName reports whether name can name a tool (1–128 letters, digits, '_', '-' or '.').
func CheckName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("tool name %q: want 1–128 letters, digits, '_', '-' or '.'", name)
	}
	return nil
}

// Definition is the tool as a chat template's `tools` list holds it (transformers' apply_chat_template,
// the OpenAI API): {"type": "function", "function": {"name", "description", "parameters"}}.
func (t Tool) Definition() map[string]any {
	params := t.Parameters
	if params == nil {
		params = map[string]any{"type": "object", "properties": map[string]any{}}
	}
	return map[string]any{
		"type": "function",
		"function": map[string]any{
			"name":        t.Name,
			"description": t.Description,
			"parameters":  params,
		},
	}
}

// Definitions is the `tools` list of a chat template for tools, in their order.
func Definitions(tools []Tool) []map[string]any {
	out := make([]map[string]any, len(tools))
	for i, t := range tools {
		out[i] = t.Definition()
	}
	return out
}

// schema is a tool's compiled parameters schema.
type schema struct {
	resolved *jsonschema.Resolved
}

// compile checks t's parameters and compiles them for validation.
func compile(t Tool) (*schema, error) {
	if t.Parameters == nil {
		return &schema{}, nil
	}
	b, err := json.Marshal(t.Parameters)
	if err != nil {
		return nil, fmt.Errorf("tool %q: parameters are not JSON: %w", t.Name, err)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("tool %q: parameters are not a JSON schema: %w", t.Name, err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("tool %q: parameters are not a JSON object: %w", t.Name, err)
	}
	if s.Type != "" && s.Type != "object" {
		return nil, fmt.Errorf("tool %q: parameters must describe an object (type is %q)", t.Name, s.Type)
	}
	// A schema in a draft the validator does not know would fail every call; say so now instead.
	switch s.Schema {
	case "", "https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#",
		"https://json-schema.org/draft-07/schema#":
	default:
		return nil, fmt.Errorf("tool %q: parameters schema: $schema %q is not draft 2020-12 or draft-07", t.Name, s.Schema)
	}
	r, err := s.Resolve(nil)
	if err != nil {
		return nil, fmt.Errorf("tool %q: parameters schema: %w", t.Name, err)
	}
	if err := checkSchemaBounds(raw); err != nil {
		return nil, fmt.Errorf("tool %q: parameters schema: %w", t.Name, err)
	}
	return &schema{resolved: r}, nil
}

// arguments reads a call's arguments: a JSON object, or (as the OpenAI API sends them) a JSON string
// holding one; empty means {}. It returns the object's JSON and the reason it is not one.
func arguments(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}"), nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
		}
		raw = bytes.TrimSpace([]byte(s))
		if len(raw) == 0 {
			return json.RawMessage("{}"), nil
		}
	}
	if !json.Valid(raw) {
		var v any
		err := json.Unmarshal(raw, &v)
		return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	if raw[0] != '{' {
		return nil, fmt.Errorf("arguments must be a JSON object, not %s", snippet(string(raw), 40))
	}
	return raw, nil
}

// validate checks a call's arguments object against the schema and returns the reason it fails.
func (s *schema) validate(args json.RawMessage) error {
	if s.resolved == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		return fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	if err := s.resolved.Validate(v); err != nil {
		return errors.New(cleanReason(err.Error()))
	}
	return nil
}

// cleanReason shortens the validator's messages: they start with "validating root: " or
// "validating /properties/x: ", which says where in the schema rather than in the arguments.
func cleanReason(msg string) string {
	for _, p := range []string{"validating root: ", "validating "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	return "arguments do not match the schema: " + msg
}

// snippet returns s cut to n runes with "…" when longer.
func snippet(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
