package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/replica"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// StartTimeout bounds a server's start-up (start or connect, initialize, list tools) and each restart.
const StartTimeout = time.Minute

// restartTries is how many times a server that died is started again before it is given up on.
const restartTries = 3

// client is drmas as MCP clients name it.
var client = mcp.NewClient(&mcp.Implementation{Name: "drmas", Version: "1"}, nil)

// Open opens a team's tools: the built-in ones own offers (nil: none) and the MCP servers cfg
// declares, started (stdio ones as child processes of this one) or connected (HTTP ones), their tools
// listed and checked against each server's Tools; a Box of them all under cfg's settings. A server that fails to start, or lacks a tool the
// config names, is an error naming it; the servers already started are then stopped. Close the Box to
// stop them when done.
func Open(ctx context.Context, cfg Config, own *Builtins) (*Box, error) {
	if err := cfg.Validate(""); err != nil {
		return nil, err
	}
	var builtins []Tool
	if own != nil {
		builtins = own.tools()
	}
	b, err := New(cfg.Settings, builtins...)
	if err != nil {
		return nil, err
	}
	for _, sc := range cfg.Servers {
		s, err := newServer(sc)
		if err != nil {
			b.Close()
			return nil, err
		}
		if err := b.attach(ctx, s, sc.Tools, sc.Timeout); err != nil {
			b.Close()
			return nil, err
		}
	}
	return b, nil
}

// attach starts s, offers the tools of its that want names (all when empty), and makes the box own it.
func (b *Box) attach(ctx context.Context, s *server, want []string, timeout time.Duration) error {
	listed, err := s.start(ctx)
	if err != nil {
		s.close()
		return err
	}
	b.owned = append(b.owned, s)
	byName := map[string]*mcp.Tool{}
	var names []string
	for _, t := range listed {
		byName[t.Name] = t
		names = append(names, t.Name)
	}
	if len(want) == 0 {
		want = names
	}
	for _, n := range want {
		t, ok := byName[n]
		if !ok {
			return fmt.Errorf("mcp server %q does not offer tool %q (it offers: %s)", s.name, n, strings.Join(names, ", "))
		}
		params, err := schemaMap(t.InputSchema)
		if err != nil {
			return fmt.Errorf("mcp server %q: tool %q: %w", s.name, n, err)
		}
		tool := Tool{Name: t.Name, Description: t.Description, Parameters: params, Run: s.caller(t.Name)}
		if err := b.add(tool, timeout, fmt.Sprintf("mcp server %q", s.name)); err != nil {
			return err
		}
	}
	return nil
}

// schemaMap is a listed tool's input schema as a JSON object.
func schemaMap(v any) (map[string]any, error) {
	switch m := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return m, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("input schema is not a JSON object: %s", snippet(string(b), 80))
	}
	return m, nil
}

// server is a connection to an MCP server, started again when it fails: a stdio server's process is
// restarted, an HTTP server gets a new session.
type server struct {
	name    string
	connect func(ctx context.Context) (*mcp.ClientSession, error)
	stderr  *tail // a stdio server's last stderr lines; nil for HTTP

	mu       sync.Mutex
	sess     *mcp.ClientSession // nil while (re)starting
	gen      int                // bumped at each restart
	up       chan struct{}      // closed when a restart ends
	err      error              // set when the server was given up on or closed
	restarts int
	wg       sync.WaitGroup // restarts in flight

	life context.Context // ends at close, stopping a restart in flight
	end  context.CancelFunc
}

// newServer prepares the connection sc declares; start makes it.
func newServer(sc Server) (*server, error) {
	s := &server{name: sc.Name, up: make(chan struct{})}
	close(s.up)
	s.life, s.end = context.WithCancel(context.Background())
	if sc.URL != "" {
		hc := &http.Client{}
		if sc.KeyEnv != "" {
			key := os.Getenv(sc.KeyEnv)
			if key == "" {
				return nil, fmt.Errorf("mcp server %q: key_env names %s, which is not set", sc.Name, sc.KeyEnv)
			}
			hc.Transport = bearer{key: key, base: http.DefaultTransport}
		}
		s.connect = func(ctx context.Context) (*mcp.ClientSession, error) {
			t := &mcp.StreamableClientTransport{Endpoint: sc.URL, HTTPClient: hc, DisableStandaloneSSE: true}
			return client.Connect(ctx, t, nil)
		}
		return s, nil
	}
	s.stderr = &tail{}
	env := inheritEnv(os.Environ())
	for _, k := range slices.Sorted(maps.Keys(sc.Env)) {
		env = append(env, k+"="+sc.Env[k])
	}
	s.connect = func(ctx context.Context) (*mcp.ClientSession, error) {
		cmd := exec.Command(sc.Command, sc.Args...)
		cmd.Env = env
		cmd.Stderr = s.stderr
		replica.DieWithParent(cmd) // no server outlives a killed trainer
		return client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil)
	}
	return s, nil
}

// inheritedEnv are the variables of drmas's environment a stdio server inherits: the official
// TypeScript SDK's default set on POSIX (getDefaultEnvironment: HOME, LOGNAME, PATH, SHELL, TERM,
// USER), and the locale (LANG, LANGUAGE, LC_*), which decides how a server reads and writes text.
// Anything else (API keys, cloud credentials, DRMAS_API_KEY) stays with drmas: a server that needs a
// variable gets it from its own env.
var inheritedEnv = map[string]bool{"HOME": true, "LOGNAME": true, "PATH": true, "SHELL": true, "TERM": true,
	"USER": true, "LANG": true, "LANGUAGE": true}

// inheritEnv is the part of environ (KEY=value entries) a stdio server inherits (inheritedEnv). As the
// TypeScript SDK does, a value starting with "()" (an exported shell function) is left out.
func inheritEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !(inheritedEnv[k] || strings.HasPrefix(k, "LC_")) || strings.HasPrefix(v, "()") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// start connects and lists the server's tools.
func (s *server) start(ctx context.Context) ([]*mcp.Tool, error) {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	sess, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("mcp server %q: start: %v%s", s.name, err, s.stderrNote())
	}
	var tools []*mcp.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			sess.Close()
			return nil, fmt.Errorf("mcp server %q: list tools: %v%s", s.name, err, s.stderrNote())
		}
		tools = append(tools, t)
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	return tools, nil
}

// caller is the Func that calls the server's tool name.
func (s *server) caller(name string) Func {
	return func(ctx context.Context, _ *env.Task, args json.RawMessage) (Output, error) {
		sess, gen, err := s.session(ctx)
		if err != nil {
			return Output{}, err
		}
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err == nil {
			return Output{Text: resultText(res), IsError: res.IsError}, nil
		}
		if ctx.Err() != nil {
			return Output{}, ctx.Err()
		}
		// The server answered with a JSON-RPC error (an unknown tool, invalid params, a handler that
		// threw): its answer, not a transport failure.
		var we *jsonrpc.Error
		if errors.As(err, &we) {
			return Output{Text: we.Message, IsError: true}, nil
		}
		s.restart(gen, err)
		err = fmt.Errorf("mcp server %q: %v", s.name, err)
		switch {
		case strings.Contains(err.Error(), frameTooLarge):
			return Output{}, &callFault{failure: ResultTooLarge, err: err, reason: func(int) string {
				return fmt.Sprintf("its answer is longer than the %d bytes the MCP SDK reads in one message (mcp server %q; its connection is made again)",
					mcp.DefaultMaxLineLength, s.name)
			}}
		case s.stderr != nil: // a stdio server's connection broke: its process died (or closed its stdout)
			return Output{}, &callFault{failure: ServerDied, retry: true, err: err, reason: func(tries int) string {
				return fmt.Sprintf("mcp server %q died during each of the %d tries of the call (restarted each time: its arguments kill it)%s",
					s.name, tries, s.stderrNote())
			}}
		}
		return Output{}, err
	}
}

// frameTooLarge is the text of the SDK's error (unexported) for an incoming message longer than
// mcp.DefaultMaxLineLength: the connection is broken after it.
const frameTooLarge = "exceeded the configured maximum line length"

// session waits for the current session (past a restart in flight) or for ctx.
func (s *server) session(ctx context.Context) (*mcp.ClientSession, int, error) {
	for {
		s.mu.Lock()
		sess, gen, up, err := s.sess, s.gen, s.up, s.err
		s.mu.Unlock()
		switch {
		case err != nil:
			return nil, 0, stopped(err)
		case sess != nil:
			return sess, gen, nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

// restart replaces the session of generation gen, which failed with cause, by a new one (a new
// process for a stdio server), in the background; calls wait for it in session. Only the first
// failure of a generation restarts it. After restartTries failed starts the server is given up on.
func (s *server) restart(gen int, cause error) {
	s.mu.Lock()
	if s.gen != gen || s.sess == nil || s.err != nil {
		s.mu.Unlock()
		return
	}
	old := s.sess
	s.sess = nil
	s.up = make(chan struct{})
	s.wg.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.wg.Done()
		old.Close()
		var sess *mcp.ClientSession
		var err error
		for try := 1; try <= restartTries; try++ {
			if try > 1 {
				select {
				case <-time.After(backoff(try - 1)):
				case <-s.life.Done():
				}
			}
			ctx, cancel := context.WithTimeout(s.life, StartTimeout)
			sess, err = s.connect(ctx)
			cancel()
			if err == nil || s.life.Err() != nil {
				break
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		defer close(s.up)
		switch {
		case s.err != nil: // closed meanwhile
			if sess != nil {
				sess.Close()
			}
		case err != nil:
			again := "restarted"
			if s.stderr == nil {
				again = "reconnected"
			}
			s.err = fmt.Errorf("mcp server %q failed (%v) and could not be %s in %d tries: %v%s",
				s.name, cause, again, restartTries, err, s.stderrNote())
		default:
			s.sess = sess
			s.gen++
			s.restarts++
		}
	}()
}

// close ends the session (stopping a stdio server's process) and any restart in flight.
func (s *server) close() error {
	s.mu.Lock()
	sess := s.sess
	s.sess = nil
	if s.err == nil {
		s.err = fmt.Errorf("mcp server %q: closed", s.name)
	}
	s.mu.Unlock()
	s.end()
	s.wg.Wait()
	if sess == nil {
		return nil
	}
	// A stdio server's exit status on the way out (stdin closed, then SIGTERM) is no failure.
	var exit *exec.ExitError
	if err := sess.Close(); err != nil && !errors.As(err, &exit) {
		return fmt.Errorf("mcp server %q: close: %w", s.name, err)
	}
	return nil
}

// stderrNote is the end of a stdio server's stderr for an error message, or "".
func (s *server) stderrNote() string {
	if s.stderr == nil {
		return ""
	}
	if t := s.stderr.last(5); t != "" {
		return "; its stderr ends: " + t
	}
	return ""
}

// resultText renders a call's result as text: text content as it is, other content as a short
// note of what it was; a result with structured content only gives that as JSON.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, c.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource link %s %s]", c.Name, c.URI))
		case *mcp.EmbeddedResource:
			switch r := c.Resource; {
			case r == nil:
			case r.Text != "":
				parts = append(parts, r.Text)
			default:
				parts = append(parts, fmt.Sprintf("[resource %s %s, %d bytes]", r.URI, r.MIMEType, len(r.Blob)))
			}
		default:
			b, _ := json.Marshal(c)
			parts = append(parts, string(b))
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err == nil {
			return string(b)
		}
	}
	return strings.Join(parts, "\n")
}

// bearer adds "Authorization: Bearer <key>" to each request.
type bearer struct {
	key  string
	base http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.base.RoundTrip(r)
}

// tail keeps the last bytes written to it (a process's stderr).
type tail struct {
	mu  sync.Mutex
	buf []byte
}

// tailBytes is how much of a stderr tail keeps.
const tailBytes = 4096

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailBytes {
		t.buf = slices.Clone(t.buf[len(t.buf)-tailBytes:])
	}
	return len(p), nil
}

// last returns up to n of the last non-empty lines, joined by " | ".
func (t *tail) last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(string(t.buf), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}
