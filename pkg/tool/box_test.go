package tool

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/env"
)

var addSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"a": map[string]any{"type": "integer", "minimum": 0},
		"b": map[string]any{"type": "integer"},
	},
	"required":             []any{"a", "b"},
	"additionalProperties": false,
}

// addTool is a built-in tool that adds two integers.
func addTool() Tool {
	return Tool{Name: "add", Description: "Adds two integers.", Parameters: addSchema,
		Run: func(_ context.Context, _ *env.Task, args json.RawMessage) (Output, error) {
			var a struct{ A, B int }
			if err := json.Unmarshal(args, &a); err != nil {
				return Output{}, err
			}
			return Output{Text: strconv.Itoa(a.A + a.B)}, nil
		}}
}

func TestDefinitions(t *testing.T) {
	noArgs := Tool{Name: "now", Description: "The time.", Run: func(context.Context, *env.Task, json.RawMessage) (Output, error) { return Output{}, nil }}
	got, err := json.Marshal(Definitions([]Tool{addTool(), noArgs}))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"function":{"description":"Adds two integers.","name":"add","parameters":{"additionalProperties":false,` +
		`"properties":{"a":{"minimum":0,"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"type":"object"}},"type":"function"},` +
		`{"function":{"description":"The time.","name":"now","parameters":{"properties":{},"type":"object"}},"type":"function"}]`
	if string(got) != want {
		t.Errorf("Definitions:\n got %s\nwant %s", got, want)
	}
}

func TestSchemaRejection(t *testing.T) {
	var runs atomic.Int64
	add := addTool()
	run := add.Run
	add.Run = func(ctx context.Context, _ *env.Task, args json.RawMessage) (Output, error) {
		runs.Add(1)
		return run(ctx, nil, args)
	}
	b, err := New(Settings{}, add)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args   string
		reason string // a part of the reason
	}{
		{`{"a": 1}`, `"b"`},
		{`{"a": "one", "b": 2}`, `want "integer"`},
		{`{"a": -1, "b": 2}`, "minimum"},
		{`{"a": 1.5, "b": 2}`, "integer"},
		{`{"a": 1, "b": 2, "c": 3}`, "c"},
		{`{"a": 1, "b": 2`, "not valid JSON"},
		{`[1, 2]`, "must be a JSON object"},
		{`"{\"a\": 1}"`, `"b"`}, // a JSON string holding the object, as the OpenAI API sends arguments
	} {
		res, err := b.Call(context.Background(), Call{Name: "add", Arguments: json.RawMessage(c.args)})
		if err != nil {
			t.Fatalf("%s: %v", c.args, err)
		}
		if res.Failure != BadArguments || !strings.Contains(res.Reason, c.reason) || !strings.Contains(res.Reason, `tool "add"`) {
			t.Errorf("%s: got %q %q, want %s naming %q", c.args, res.Failure, res.Reason, BadArguments, c.reason)
		}
		t.Logf("%s → %s", c.args, res.Reason)
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("the tool ran %d times on rejected arguments", n)
	}
	for _, args := range []string{`{"a": 1, "b": 2}`, `"{\"a\": 1, \"b\": 2}"`} {
		res, err := b.Call(context.Background(), Call{Name: "add", Arguments: json.RawMessage(args)})
		if err != nil || !res.OK() || res.Text != "3" {
			t.Errorf("%s: got %+v, %v; want 3", args, res, err)
		}
	}
}

func TestUnknownTool(t *testing.T) {
	b, err := New(Settings{}, addTool())
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Call(context.Background(), Call{Name: "mul", Arguments: json.RawMessage(`{}`)})
	if err != nil || res.Failure != UnknownTool || res.Reason != `unknown tool "mul" (the tools are: add)` {
		t.Errorf("got %+v, %v", res, err)
	}
	if res.Content() != res.Reason {
		t.Errorf("Content of a failure is %q, want its reason", res.Content())
	}
}

func TestFor(t *testing.T) {
	noop := func(context.Context, *env.Task, json.RawMessage) (Output, error) { return Output{Text: "ok"}, nil }
	b, err := New(Settings{}, Tool{Name: "a", Run: noop}, Tool{Name: "b", Run: noop}, Tool{Name: "c", Run: noop})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := b.For("c", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got := sub.Names(); !reflect.DeepEqual(got, []string{"c", "a"}) {
		t.Errorf("names %v", got)
	}
	if defs := sub.Definitions(); len(defs) != 2 || defs[0]["function"].(map[string]any)["name"] != "c" {
		t.Errorf("definitions %v", defs)
	}
	if res, _ := sub.Call(context.Background(), Call{Name: "b"}); res.Failure != UnknownTool {
		t.Errorf("a tool left out of For is callable: %+v", res)
	}
	if res, _ := sub.Call(context.Background(), Call{Name: "a"}); !res.OK() || res.Text != "ok" {
		t.Errorf("a: %+v", res)
	}
	if _, err := b.For("a", "z"); err == nil || !strings.Contains(err.Error(), `no tool "z"`) {
		t.Errorf("For of a missing tool: %v", err)
	}
	if _, err := New(Settings{}, Tool{Name: "a", Run: noop}, Tool{Name: "a", Run: noop}); err == nil {
		t.Error("two tools named a accepted")
	}
	if _, err := New(Settings{}, Tool{Name: "a b", Run: noop}); err == nil {
		t.Error("a tool named \"a b\" accepted")
	}
	if _, err := New(Settings{}, Tool{Name: "x", Run: noop, Parameters: map[string]any{"type": "string"}}); err == nil {
		t.Error("parameters of type string accepted")
	}
	if _, err := New(Settings{}, Tool{Name: "x", Run: noop, Parameters: map[string]any{"$schema": "http://json-schema.org/draft-04/schema#"}}); err == nil {
		t.Error("a draft-04 schema accepted")
	}
}

// TestRetries: a transport failure is tried again, up to Retries tries in all; a tool error is not.
func TestRetries(t *testing.T) {
	var tries atomic.Int64
	flaky := Tool{Name: "flaky", Run: func(context.Context, *env.Task, json.RawMessage) (Output, error) {
		if tries.Add(1) < 3 {
			return Output{}, errors.New("connection reset")
		}
		return Output{Text: "up"}, nil
	}}
	var errTries atomic.Int64
	failing := Tool{Name: "failing", Run: func(context.Context, *env.Task, json.RawMessage) (Output, error) {
		errTries.Add(1)
		return Output{Text: "no such city", IsError: true}, nil
	}}
	var downTries atomic.Int64
	down := Tool{Name: "down", Run: func(context.Context, *env.Task, json.RawMessage) (Output, error) {
		downTries.Add(1)
		return Output{}, errors.New("connection refused")
	}}
	b, err := New(Settings{Retries: 3}, flaky, failing, down)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Call(context.Background(), Call{Name: "flaky"})
	if err != nil || !res.OK() || res.Text != "up" || res.Tries != 3 {
		t.Errorf("flaky: %+v, %v; want up after 3 tries", res, err)
	}
	res, err = b.Call(context.Background(), Call{Name: "failing"})
	if err != nil || res.Failure != ToolError || res.Tries != 1 || errTries.Load() != 1 ||
		res.Reason != `tool "failing" failed: no such city` {
		t.Errorf("failing: %+v, %v (%d tries); want one try and a tool error", res, err, errTries.Load())
	}
	_, err = b.Call(context.Background(), Call{Name: "down"})
	if err == nil || downTries.Load() != 3 || !strings.Contains(err.Error(), `tool "down"`) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("down: %v after %d tries; want an error naming the tool after 3", err, downTries.Load())
	}
	var stopTries atomic.Int64
	gone := Tool{Name: "gone", Run: func(context.Context, *env.Task, json.RawMessage) (Output, error) {
		stopTries.Add(1)
		return Output{}, stopped(errors.New("server gone"))
	}}
	b, _ = New(Settings{Retries: 5}, gone)
	if _, err := b.Call(context.Background(), Call{Name: "gone"}); err == nil || stopTries.Load() != 1 {
		t.Errorf("a stopped tool: %v after %d tries; want an error after 1", err, stopTries.Load())
	}
}

func TestTruncate(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcd", 3, "abc\n…[truncated: 3 of 4 characters shown]"},
		{"ééééé", 2, "éé\n…[truncated: 2 of 5 characters shown]"},
	} {
		got, cut := truncate(c.in, c.max)
		if got != c.want || cut != (got != c.in) {
			t.Errorf("truncate(%q, %d) = %q, %v; want %q", c.in, c.max, got, cut, c.want)
		}
	}
}

func TestCallerContextEnds(t *testing.T) {
	block := Tool{Name: "block", Run: func(ctx context.Context, _ *env.Task, _ json.RawMessage) (Output, error) {
		<-ctx.Done()
		return Output{}, ctx.Err()
	}}
	b, _ := New(Settings{Timeout: time.Minute}, block)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Call(ctx, Call{Name: "block"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v; want the caller's context error, not a timeout result", err)
	}
}
