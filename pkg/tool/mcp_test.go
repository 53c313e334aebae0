package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/env"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func call(t *testing.T, b *Box, name, args string) Result {
	t.Helper()
	res, err := b.Call(context.Background(), Call{Name: name, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("%s %s: %v", name, args, err)
	}
	return res
}

// TestMCPInMemory lists and calls the tools of a server built with the SDK, over its in-memory
// transport: a call, a schema rejection (the server is not called), an unknown tool, a tool error.
func TestMCPInMemory(t *testing.T) {
	b, st := memBox(t, Settings{})
	want := []string{"add", "big", "crash", "die", "fail", "gate", "getenv", "pid", "slow"} // as the server lists them
	if got := b.Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("tools %v, want %v", got, want)
	}
	def := b.Definitions()[0]["function"].(map[string]any)
	params := def["parameters"].(map[string]any)
	if def["name"] != "add" || def["description"] != "Adds a and b." || params["type"] != "object" ||
		params["properties"].(map[string]any)["a"].(map[string]any)["type"] != "number" {
		t.Errorf("definition of add: %v", def)
	}

	if res := call(t, b, "add", `{"a": 2, "b": 3.5}`); !res.OK() || res.Text != "5.5" || res.Tries != 1 {
		t.Errorf("add: %+v", res)
	}
	before := st.calls.Load()
	res := call(t, b, "add", `{"a": 2, "b": "three"}`)
	if res.Failure != BadArguments || !strings.Contains(res.Reason, "three") {
		t.Errorf("add with a string: %+v", res)
	}
	if res := call(t, b, "add", `{"a": 2}`); res.Failure != BadArguments || !strings.Contains(res.Reason, `"b"`) {
		t.Errorf("add without b: %+v", res)
	}
	if st.calls.Load() != before {
		t.Error("the server was called with arguments that fail the schema")
	}
	if res := call(t, b, "sub", `{}`); res.Failure != UnknownTool || !strings.Contains(res.Reason, `"sub"`) {
		t.Errorf("sub: %+v", res)
	}
	res = call(t, b, "fail", `{}`)
	if res.Failure != ToolError || res.Text != "boom: the tool failed" || res.Tries != 1 ||
		res.Content() != `tool "fail" failed: boom: the tool failed` {
		t.Errorf("fail: %+v", res)
	}
}

func TestMCPTimeout(t *testing.T) {
	b, _ := memBox(t, Settings{Timeout: 200 * time.Millisecond})
	start := time.Now()
	res := call(t, b, "slow", `{"seconds": 30}`)
	if res.Failure != Timeout || res.Reason != `tool "slow": no answer within 200ms` {
		t.Errorf("slow: %+v", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the timed-out call took %v", d)
	}
	if res := call(t, b, "slow", `{"seconds": 0.01}`); !res.OK() || res.Text != "slept" {
		t.Errorf("a quick call after a timeout: %+v", res)
	}
}

func TestMCPTruncation(t *testing.T) {
	b, _ := memBox(t, Settings{MaxResultChars: 100})
	res := call(t, b, "big", `{"n": 10000}`)
	if !res.OK() || !res.Truncated || res.Text != strings.Repeat("x", 100)+"\n…[truncated: 100 of 10000 characters shown]" {
		t.Errorf("big: truncated %v, %d chars: %q", res.Truncated, len(res.Text), res.Text[max(0, len(res.Text)-60):])
	}
	if res := call(t, b, "big", `{"n": 100}`); res.Truncated || len(res.Text) != 100 {
		t.Errorf("100 characters were cut: %+v", res)
	}
}

// TestMCPConcurrency: with Concurrency 2, no more than 2 of 8 simultaneous calls reach the server at
// once, and 2 do.
func TestMCPConcurrency(t *testing.T) {
	b, st := memBox(t, Settings{Concurrency: 2})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if res, err := b.Call(context.Background(), Call{Name: "gate"}); err != nil || !res.OK() {
				t.Errorf("gate: %+v %v", res, err)
			}
		})
	}
	wg.Wait()
	if m := st.maxIn.Load(); m != 2 {
		t.Errorf("at most %d calls ran at once, want 2", m)
	}
}

// TestMCPHTTP opens a streamable-HTTP server (httptest) through the config, with its key from the
// environment variable key_env names, and a per-server timeout.
func TestMCPHTTP(t *testing.T) {
	url, _ := httpServer(t, "sekret")
	t.Setenv("DRMAS_TEST_MCP_KEY", "sekret")
	cfg := Config{Servers: []Server{{Name: "web", URL: url, KeyEnv: "DRMAS_TEST_MCP_KEY",
		Timeout: 300 * time.Millisecond, Tools: []string{"add", "slow", "fail"}}}}
	b, err := Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := strings.Join(b.Names(), ","); got != "add,slow,fail" {
		t.Errorf("tools %s; want those the config names, in its order", got)
	}
	if res := call(t, b, "add", `{"a": 1, "b": 2}`); !res.OK() || res.Text != "3" {
		t.Errorf("add: %+v", res)
	}
	if res := call(t, b, "fail", `{}`); res.Failure != ToolError {
		t.Errorf("fail: %+v", res)
	}
	if res := call(t, b, "slow", `{"seconds": 10}`); res.Failure != Timeout || !strings.Contains(res.Reason, "300ms") {
		t.Errorf("slow: %+v", res)
	}

	cfg.Servers[0].Tools = []string{"add", "multiply"}
	_, err = Open(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), `mcp server "web" does not offer tool "multiply"`) {
		t.Errorf("a tool the server lacks: %v", err)
	}
	cfg.Servers[0].Tools = nil
	t.Setenv("DRMAS_TEST_MCP_KEY", "wrong")
	_, err = Open(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), `mcp server "web"`) {
		t.Errorf("a wrong key: %v", err)
	}
	t.Setenv("DRMAS_TEST_MCP_KEY", "")
	_, err = Open(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "DRMAS_TEST_MCP_KEY, which is not set") {
		t.Errorf("an unset key: %v", err)
	}
}

// TestMCPStdioRestart runs the test binary as a stdio server: a server killed between calls and one
// that exits during a call are restarted (new processes) and the calls tried again; Close stops it.
func TestMCPStdioRestart(t *testing.T) {
	b, err := Open(context.Background(), Config{Servers: []Server{stdioServer(t, "local", nil)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s := b.owned[0]
	pid := func() int {
		res := call(t, b, "pid", `{}`)
		p, err := strconv.Atoi(res.Text)
		if err != nil {
			t.Fatalf("pid: %+v", res)
		}
		return p
	}
	p1 := pid()
	if err := syscall.Kill(p1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the process is dead; it is reaped when its session is replaced
	res := call(t, b, "add", `{"a": 1, "b": 1}`)
	if !res.OK() || res.Text != "2" || res.Tries < 2 {
		t.Errorf("add after the server was killed: %+v; want 2 after a restart", res)
	}
	p2 := pid()
	if p2 == p1 {
		t.Errorf("the server was not restarted (pid %d)", p1)
	}

	marker := filepath.Join(t.TempDir(), "crashed")
	res = call(t, b, "crash", `{"marker": "`+marker+`"}`)
	if !res.OK() || !strings.HasPrefix(res.Text, "survived in pid ") || res.Tries != 2 {
		t.Errorf("crash: %+v; want an answer from the restarted server on try 2", res)
	}
	p3 := pid()
	if p3 == p2 || res.Text != "survived in pid "+strconv.Itoa(p3) {
		t.Errorf("pids %d, %d; answer %q", p2, p3, res.Text)
	}
	s.mu.Lock()
	restarts := s.restarts
	s.mu.Unlock()
	if restarts != 2 {
		t.Errorf("%d restarts, want 2", restarts)
	}
	if err := b.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	waitGone(t, p3)
}

// TestMCPStdioGivenUp: a server that exits and then refuses to start is given up on after its tries;
// the call's error names it and quotes its stderr, and later calls fail at once.
func TestMCPStdioGivenUp(t *testing.T) {
	dir := t.TempDir()
	nostart := filepath.Join(dir, "nostart")
	b, err := Open(context.Background(), Config{Servers: []Server{stdioServer(t, "flaky", map[string]string{noStartEnv: nostart})}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.Call(context.Background(), Call{Name: "crash",
		Arguments: json.RawMessage(`{"marker": "` + filepath.Join(dir, "m") + `", "nostart": "` + nostart + `"}`)})
	if err == nil || !strings.Contains(err.Error(), `mcp server "flaky" failed`) ||
		!strings.Contains(err.Error(), "could not be restarted in 3 tries") || !strings.Contains(err.Error(), "refusing to start") {
		t.Fatalf("got %v; want an error naming the server, its tries and its stderr", err)
	}
	t.Log(err)
	start := time.Now()
	_, err = b.Call(context.Background(), Call{Name: "pid"})
	if err == nil || !strings.Contains(err.Error(), `mcp server "flaky"`) || time.Since(start) > time.Second {
		t.Errorf("a call after the server was given up on: %v after %v", err, time.Since(start))
	}
	if !isStopped(err) {
		t.Errorf("the error is not final: %v", err)
	}
}

func TestOpenFailures(t *testing.T) {
	_, err := Open(context.Background(), Config{Servers: []Server{{Name: "nope", Command: filepath.Join(t.TempDir(), "missing")}}}, nil)
	if err == nil || !strings.Contains(err.Error(), `mcp server "nope": start`) {
		t.Errorf("a missing command: %v", err)
	}
	// The first server starts; the second lacks a tool: Open fails and stops the first.
	url, _ := httpServer(t, "")
	_, err = Open(context.Background(), Config{Servers: []Server{stdioServer(t, "local", nil), {Name: "web", URL: url, Tools: []string{"pid"}}}}, nil)
	if err == nil || !strings.Contains(err.Error(), `tool "pid" is offered twice`) {
		t.Errorf("two servers offering pid: %v", err)
	}
	if _, err := Open(context.Background(), Config{Servers: []Server{{Name: "x"}}}, nil); err == nil || !strings.Contains(err.Error(), "mcp_servers[0] (x).command") {
		t.Errorf("an invalid config: %v", err)
	}
}

// waitGone waits for process pid to end (up to 10 s).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for range 200 {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("process %d still runs", pid)
}

// TestMCPHTTPReconnect: an HTTP server that restarted (its sessions forgotten) gets a new session and
// the call is tried again.
func TestMCPHTTPReconnect(t *testing.T) {
	var mu sync.Mutex
	newHandler := func() http.Handler {
		srv, _ := testServer()
		return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	}
	h := newHandler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		cur := h
		mu.Unlock()
		cur.ServeHTTP(w, r)
	}))
	defer ts.Close()
	b, err := Open(context.Background(), Config{Servers: []Server{{Name: "web", URL: ts.URL}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if res := call(t, b, "add", `{"a": 1, "b": 2}`); !res.OK() || res.Tries != 1 {
		t.Fatalf("add: %+v", res)
	}
	mu.Lock()
	h = newHandler()
	mu.Unlock()
	if res := call(t, b, "add", `{"a": 2, "b": 2}`); !res.OK() || res.Text != "4" || res.Tries != 2 {
		t.Errorf("add after the server forgot its sessions: %+v; want 4 on try 2", res)
	}
	s := b.owned[0]
	s.mu.Lock()
	n := s.restarts
	s.mu.Unlock()
	if n != 1 {
		t.Errorf("%d reconnections, want 1", n)
	}
}

// TestMCPStdioEnvironment: a stdio server gets a safe default environment (PATH, HOME, the locale…)
// and its own env, never the rest of drmas's: secrets in the parent's environment stay there.
func TestMCPStdioEnvironment(t *testing.T) {
	t.Setenv("DRMAS_API_KEY", "parent-secret-key")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "parent-aws-secret")
	t.Setenv("LANG", "C.UTF-8")
	b, err := Open(context.Background(), Config{Servers: []Server{stdioServer(t, "local", map[string]string{"OWN_SETTING": "mine"})}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for name, want := range map[string]string{
		"DRMAS_API_KEY":         "<unset>",
		"AWS_SECRET_ACCESS_KEY": "<unset>",
		"OWN_SETTING":           "mine",
		"PATH":                  os.Getenv("PATH"),
		"LANG":                  "C.UTF-8",
	} {
		if res := call(t, b, "getenv", `{"name": "`+name+`"}`); !res.OK() || res.Text != want {
			t.Errorf("the server's %s: %+v; want %q", name, res, want)
		}
	}
}

// TestMCPSchemaCycle: a tool whose input schema applies itself to the same value ($ref cycles, direct
// or through allOf, anchors) is refused when the server's tools are listed, naming the server and the
// tool, instead of overflowing the stack at its first call; so are a schema whose references fan out
// past the bound and one nested too deep. A recursive schema that descends into the value (a tree) is
// accepted and checks calls.
func TestMCPSchemaCycle(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(64 << 20)) // before the bound, the first call overflowed: fast
	handler := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran"}}}, nil
	}
	fanout := `"$defs": {`
	for i := range 20 { // a0 applies a1 twice, a1 a2 twice …: 2^20 subschemas for one value
		fanout += fmt.Sprintf(`"a%d": {"allOf": [{"$ref": "#/$defs/a%d"}, {"$ref": "#/$defs/a%d"}]}, `, i, i+1, i+1)
	}
	fanout += `"a20": {"type": "number"}}`
	deep := `{"type": "object"}`
	for range 70 {
		deep = `{"type": "object", "properties": {"x": ` + deep + `}}`
	}
	for name, c := range map[string]struct{ schema, want string }{
		"self":    {`{"type": "object", "$ref": "#"}`, "cycle: # → #"},
		"defs":    {`{"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}}`, "cycle: #/$defs/a → #/$defs/b"},
		"anyOf":   {`{"type": "object", "anyOf": [{"type": "object"}, {"not": {"$ref": "#"}}]}`, "cycle"},
		"pointer": {`{"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}}`, "cycle: #/properties/x → #/properties/x"},
		"anchor":  {`{"type": "object", "properties": {"x": {"$anchor": "me", "allOf": [{"$ref": "#me"}]}}}`, "cycle"},
		"fanout":  {`{"type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}, ` + fanout + `}`, "more than 10000 subschemas"},
		"deep":    {deep, "nested more than 64 deep"},
	} {
		schema := c.schema
		t.Run(name, func(t *testing.T) {
			srv := mcp.NewServer(&mcp.Implementation{Name: "loopy", Version: "1"}, nil)
			var m map[string]any
			if err := json.Unmarshal([]byte(schema), &m); err != nil {
				t.Fatal(err)
			}
			srv.AddTool(&mcp.Tool{Name: "loop", InputSchema: m}, handler)
			b, err := New(Settings{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			err = b.attach(context.Background(), memServer("loopy", srv), nil, 0)
			if err == nil {
				res, cerr := b.Call(context.Background(), Call{Name: "loop", Arguments: json.RawMessage(`{"x": 1}`)})
				t.Fatalf("a cyclic schema was accepted; its call gave %+v, %v", res, cerr)
			}
			if !strings.Contains(err.Error(), `mcp server "loopy"`) || !strings.Contains(err.Error(), `tool "loop"`) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v; want an error naming the server, the tool and %q", err, c.want)
			}
			t.Log(err)
		})
	}
	t.Run("tree", func(t *testing.T) {
		srv := mcp.NewServer(&mcp.Implementation{Name: "trees", Version: "1"}, nil)
		var m map[string]any
		_ = json.Unmarshal([]byte(`{"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}}`), &m)
		srv.AddTool(&mcp.Tool{Name: "tree", InputSchema: m}, handler)
		b, err := New(Settings{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.attach(context.Background(), memServer("trees", srv), nil, 0); err != nil {
			t.Fatalf("a recursive schema that descends into the value: %v", err)
		}
		if res := call(t, b, "tree", `{"name": "a", "children": [{"name": "b", "children": []}]}`); !res.OK() || res.Text != "ran" {
			t.Errorf("a valid tree: %+v", res)
		}
		if res := call(t, b, "tree", `{"children": [{"name": 3}]}`); res.Failure != BadArguments {
			t.Errorf("a bad tree: %+v; want bad_arguments", res)
		}
	})
}

// TestMCPStdioCallFaults: a call whose arguments make a stdio server die on every try, and one whose
// result is longer than the SDK's line limit (which breaks the connection), are failed calls of the
// agent (it is told why), not errors that end the run; the server is restarted for the next call.
func TestMCPStdioCallFaults(t *testing.T) {
	b, err := Open(context.Background(), Config{Servers: []Server{stdioServer(t, "local", nil)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct {
		name, args string
		failure    Failure
		reason     []string
	}{
		{"die", `{}`, ServerDied, []string{`tool "die"`, `mcp server "local" died during each of the 3 tries`, "dying on purpose"}},
		{"big", fmt.Sprintf(`{"n": %d}`, mcp.DefaultMaxLineLength+1), ResultTooLarge, []string{`tool "big"`, "longer than", "16777216"}},
	} {
		res, err := b.Call(context.Background(), Call{Name: c.name, Arguments: json.RawMessage(c.args)})
		if err != nil {
			t.Fatalf("%s: %v; want a failed call, not an error", c.name, err)
		}
		if res.Failure != c.failure {
			t.Errorf("%s: %+v; want failure %s", c.name, res, c.failure)
		}
		for _, want := range c.reason {
			if !strings.Contains(res.Reason, want) {
				t.Errorf("%s: reason %q; want it to say %q", c.name, res.Reason, want)
			}
		}
		if res := call(t, b, "add", `{"a": 1, "b": 2}`); !res.OK() || res.Text != "3" {
			t.Errorf("add after %s: %+v", c.name, res)
		}
		// In a flow, the failure is the agent's invalid call (a ToolError), not an error ending the rollout.
		_, err = b.Run(context.Background(), &env.Task{}, c.name, json.RawMessage(c.args))
		var te *env.ToolError
		if !errors.As(err, &te) {
			t.Errorf("%s through the flow's toolbox: %v; want an *env.ToolError", c.name, err)
		}
	}
}
