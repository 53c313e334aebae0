package tool

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/tool/tooltest"
)

// TestServerEverything lists and calls the tools of the MCP project's own test server, a real
// third-party server (TypeScript SDK), over stdio and over streamable HTTP: calls that answer, one the
// server fails, one our schema check refuses, a slow one that finishes and one that times out.
func TestServerEverything(t *testing.T) {
	node, entry := tooltest.Everything(t, "../../")
	const timeout = 3 * time.Second
	t.Run("stdio", func(t *testing.T) {
		exerciseEverything(t, Server{Name: "everything", Command: node, Args: []string{entry, "stdio"}, Timeout: timeout})
	})
	t.Run("http", func(t *testing.T) {
		url := tooltest.EverythingHTTP(t, node, entry)
		exerciseEverything(t, Server{Name: "everything-http", URL: url, Timeout: timeout})
	})
}

func exerciseEverything(t *testing.T, sc Server) {
	ctx := context.Background()
	b, err := Open(ctx, Config{Servers: []Server{sc}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	names := b.Names()
	t.Logf("%s lists %d tools: %s", sc.Name, len(names), strings.Join(names, ", "))
	for _, n := range []string{"echo", "get-sum", "get-resource-reference", "trigger-long-running-operation"} {
		if !slices.Contains(names, n) {
			t.Fatalf("%s does not list %s", sc.Name, n)
		}
	}
	for _, d := range b.Definitions() {
		if f := d["function"].(map[string]any); f["name"] == "get-sum" {
			t.Logf("get-sum as the chat template sees it: %v", f)
		}
	}

	check := func(name, args string, want Failure, text *regexp.Regexp) Result {
		t.Helper()
		res := call(t, b, name, args)
		t.Logf("%s %s → failure %q tries %d in %v: %s", name, args, res.Failure, res.Tries,
			res.Elapsed.Round(10*time.Millisecond), snippet(res.Content(), 160))
		if res.Failure != want || !text.MatchString(res.Content()) {
			t.Errorf("%s %s: got failure %q %q; want %q matching %s", name, args, res.Failure, res.Content(), want, text)
		}
		return res
	}
	check("echo", `{"message": "hello from drmas"}`, "", regexp.MustCompile(`^Echo: hello from drmas$`))
	check("get-sum", `{"a": 2, "b": 40}`, "", regexp.MustCompile(`^The sum of 2 and 40 is 42\.$`))
	// Refused by the schema the server listed, before it is called.
	check("get-sum", `{"a": "two", "b": 40}`, BadArguments, regexp.MustCompile(`want "number"`))
	// Valid for the schema (a number), refused by the tool itself: the server answers an error.
	check("get-resource-reference", `{"resourceType": "Text", "resourceId": 0}`, ToolError,
		regexp.MustCompile(`Invalid resourceId: 0`))
	check("no-such-tool", `{}`, UnknownTool, regexp.MustCompile(`unknown tool "no-such-tool"`))
	// Slow: 1 s in 2 steps finishes within the 3 s timeout; 30 s does not.
	check("trigger-long-running-operation", `{"duration": 1, "steps": 2}`, "",
		regexp.MustCompile(`^Long running operation completed\. Duration: 1 seconds, Steps: 2\.$`))
	start := time.Now()
	res := check("trigger-long-running-operation", `{"duration": 30, "steps": 3}`, Timeout,
		regexp.MustCompile(`no answer within 3s`))
	if d := time.Since(start); d < 3*time.Second || d > 10*time.Second || res.Tries != 1 {
		t.Errorf("the timed-out call took %v in %d tries; want about 3 s in 1", d, res.Tries)
	}
	// The server still answers after a call that timed out.
	check("echo", `{"message": "still here"}`, "", regexp.MustCompile(`^Echo: still here$`))
}
