package tool

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The test binary is also a stdio MCP server: with serverEnv set it serves testServer on stdin and
// stdout instead of running the tests (the stdio tests start it as their command).
const (
	serverEnv   = "DRMAS_TOOL_TEST_SERVER"
	noStartEnv  = "DRMAS_TOOL_TEST_NOSTART" // a file whose presence makes the server refuse to start
	serverStart = "test server: "
)

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		if f := os.Getenv(noStartEnv); f != "" {
			if _, err := os.Stat(f); err == nil {
				fmt.Fprintln(os.Stderr, serverStart+"refusing to start: "+f+" exists")
				os.Exit(3)
			}
		}
		fmt.Fprintf(os.Stderr, serverStart+"pid %d up\n", os.Getpid())
		srv, _ := testServer()
		if err := srv.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, serverStart+err.Error())
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serverStats counts what testServer's tools saw.
type serverStats struct {
	calls    atomic.Int64 // calls of any tool
	inFlight atomic.Int64
	maxIn    atomic.Int64 // the most "gate" calls running at once
}

type (
	addIn struct {
		A float64 `json:"a"`
		B float64 `json:"b"`
	}
	slowIn struct {
		Seconds float64 `json:"seconds"`
	}
	bigIn struct {
		N int `json:"n"`
	}
	crashIn struct {
		// Marker: when it does not exist, the call creates it and the server exits at once (the call
		// never answers); when it does, the call answers "survived".
		Marker string `json:"marker"`
		// NoStart, when set, is created before exiting, so that the server refuses to start again.
		NoStart string `json:"nostart,omitempty"`
	}
	envIn struct {
		Name string `json:"name"`
	}
	empty struct{}
)

// testServer is an MCP server with tools for each behaviour the tests need.
func testServer() (*mcp.Server, *serverStats) {
	st := &serverStats{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "drmas-test", Version: "1"}, nil)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "add", Description: "Adds a and b."},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			return text(fmt.Sprint(in.A + in.B)), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "fail", Description: "Always fails."},
		func(_ context.Context, _ *mcp.CallToolRequest, _ empty) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "boom: the tool failed"}}}, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "slow", Description: "Answers after the given seconds."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in slowIn) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			select {
			case <-time.After(time.Duration(in.Seconds * float64(time.Second))):
				return text("slept"), nil, nil
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "big", Description: "Answers n characters."},
		func(_ context.Context, _ *mcp.CallToolRequest, in bigIn) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			return text(strings.Repeat("x", in.N)), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "gate", Description: "Holds the call for 100 ms."},
		func(_ context.Context, _ *mcp.CallToolRequest, _ empty) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			n := st.inFlight.Add(1)
			defer st.inFlight.Add(-1)
			for {
				m := st.maxIn.Load()
				if n <= m || st.maxIn.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
			return text("passed"), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "pid", Description: "The server's process id."},
		func(_ context.Context, _ *mcp.CallToolRequest, _ empty) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			return text(fmt.Sprint(os.Getpid())), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "getenv", Description: "The server's environment variable name, or <unset>."},
		func(_ context.Context, _ *mcp.CallToolRequest, in envIn) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			v, ok := os.LookupEnv(in.Name)
			if !ok {
				v = "<unset>"
			}
			return text(v), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "die", Description: "Exits the server, every time."},
		func(_ context.Context, _ *mcp.CallToolRequest, _ empty) (*mcp.CallToolResult, any, error) {
			fmt.Fprintln(os.Stderr, serverStart+"dying on purpose")
			os.Exit(4)
			return nil, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "crash", Description: "Exits the server once."},
		func(_ context.Context, _ *mcp.CallToolRequest, in crashIn) (*mcp.CallToolResult, any, error) {
			st.calls.Add(1)
			if _, err := os.Stat(in.Marker); err == nil {
				return text(fmt.Sprintf("survived in pid %d", os.Getpid())), nil, nil
			}
			if err := os.WriteFile(in.Marker, nil, 0o644); err != nil {
				return nil, nil, err
			}
			if in.NoStart != "" {
				if err := os.WriteFile(in.NoStart, nil, 0o644); err != nil {
					return nil, nil, err
				}
			}
			fmt.Fprintln(os.Stderr, serverStart+"crashing on purpose")
			os.Exit(2)
			return nil, nil, nil
		})
	return srv, st
}

// memServer is a server reached through the SDK's in-memory transport: each (re)connection serves a
// new session of srv.
func memServer(name string, srv *mcp.Server) *server {
	s := &server{name: name, up: make(chan struct{})}
	close(s.up)
	s.life, s.end = context.WithCancel(context.Background())
	s.connect = func(ctx context.Context) (*mcp.ClientSession, error) {
		ct, st := mcp.NewInMemoryTransports()
		if _, err := srv.Connect(ctx, st, nil); err != nil {
			return nil, err
		}
		return client.Connect(ctx, ct, nil)
	}
	return s
}

// memBox is a Box of testServer's tools over the in-memory transport.
func memBox(t *testing.T, s Settings) (*Box, *serverStats) {
	t.Helper()
	srv, st := testServer()
	b, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.attach(context.Background(), memServer("mem", srv), nil, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, st
}

// httpServer serves testServer over streamable HTTP on loopback; with key set, requests without
// "Authorization: Bearer <key>" get 401.
func httpServer(t *testing.T, key string) (string, *serverStats) {
	t.Helper()
	srv, st := testServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	var mu sync.Mutex
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := key == "" || r.Header.Get("Authorization") == "Bearer "+key
		mu.Unlock()
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp", st
}

// stdioServer declares the test binary as a stdio server.
func stdioServer(t *testing.T, name string, env map[string]string) Server {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := map[string]string{serverEnv: "1"}
	for k, v := range env {
		e[k] = v
	}
	return Server{Name: name, Command: exe, Env: e}
}
