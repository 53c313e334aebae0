package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/drmas/drmas/pkg/env"
)

// Failure classifies a call that did not succeed. The empty Failure is a success.
type Failure string

// The failures of a call: each is the caller's (the model's) doing or the tool's answer, and goes back
// to the model as the call's result; an infrastructure failure is Call's error instead.
const (
	UnknownTool  Failure = "unknown_tool"  // no tool of that name in the box
	BadArguments Failure = "bad_arguments" // arguments not a JSON object, or failing the tool's schema
	ToolError    Failure = "tool_error"    // the tool ran and reported an error
	Timeout      Failure = "timeout"       // the call ran past its timeout
	// ServerDied: the tool's stdio server died during every try of the call (and was restarted each
	// time): the arguments kill it.
	ServerDied Failure = "server_died"
	// ResultTooLarge: the tool's answer is longer than the MCP SDK reads in one message
	// (mcp.DefaultMaxLineLength); the connection it broke is made again.
	ResultTooLarge Failure = "result_too_large"
)

// Call is a tool call as a model makes it.
type Call struct {
	Name string
	// Arguments is a JSON object, or a JSON string holding one (the OpenAI API's form); empty is {}.
	Arguments json.RawMessage
	// Task is the episode the call belongs to (the built-in tools read its facts and documents).
	Task *env.Task
}

// Result is a call's outcome for the model.
type Result struct {
	// Text is the tool's answer (on success, or its error text when Failure is ToolError), cut to the
	// box's MaxResultChars with a marker saying how much was cut.
	Text string
	// Failure is "" when the call succeeded.
	Failure Failure
	// Reason says why the call failed (empty on success); it names the tool.
	Reason    string
	Truncated bool          // Text was cut
	Tries     int           // attempts made: 0 for a call refused before it ran, more than 1 after transport failures
	Elapsed   time.Duration // from the start of the first attempt to the end of the last
}

// OK reports whether the call succeeded.
func (r Result) OK() bool { return r.Failure == "" }

// Content is what the model is shown as the call's result: the answer on success, the reason
// otherwise (which, for a tool error, carries the tool's own text).
func (r Result) Content() string {
	if r.OK() {
		return r.Text
	}
	return r.Reason
}

// Box holds the tools an agent may call and runs its calls: arguments checked against the tool's
// schema, at most Concurrency calls at a time, each bounded by its timeout, transport failures tried
// again, results cut to MaxResultChars. It is safe for concurrent use. A Box from Open owns the MCP
// servers it started: Close stops them. A Box from For shares its parent's servers and limits.
type Box struct {
	s     Settings
	tools map[string]*entry
	order []string // tool names in the order they were added
	slots chan struct{}
	owned []*server // servers to close (nil in a Box from For)
}

// entry is a tool with its compiled schema and its own timeout (0: the box's).
type entry struct {
	tool    Tool
	schema  *schema
	timeout time.Duration
}

// New returns a Box of the given tools (built-in ones; Open adds MCP servers' tools). s's zero fields
// take the defaults.
func New(s Settings, tools ...Tool) (*Box, error) {
	b := newBox(s)
	for _, t := range tools {
		if err := b.add(t, 0, "built-in"); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func newBox(s Settings) *Box {
	s = s.withDefaults()
	return &Box{s: s, tools: map[string]*entry{}, slots: make(chan struct{}, s.Concurrency)}
}

// add checks and adds a tool; from names where it comes from, for the error of a duplicate name.
func (b *Box) add(t Tool, timeout time.Duration, from string) error {
	if err := CheckName(t.Name); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	if t.Run == nil {
		return fmt.Errorf("%s: tool %q has no Run", from, t.Name)
	}
	if _, dup := b.tools[t.Name]; dup {
		return fmt.Errorf("%s: tool %q is offered twice (two servers, or a server and a built-in tool)", from, t.Name)
	}
	sch, err := compile(t)
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	b.tools[t.Name] = &entry{tool: t, schema: sch, timeout: timeout}
	b.order = append(b.order, t.Name)
	return nil
}

// Tools returns the box's tools in the order they were added (built-in ones first, then each
// server's in the order of the config).
func (b *Box) Tools() []Tool {
	out := make([]Tool, len(b.order))
	for i, n := range b.order {
		out[i] = b.tools[n].tool
	}
	return out
}

// Names returns the names of the box's tools, in order.
func (b *Box) Names() []string { return slices.Clone(b.order) }

// Definitions is the chat template's `tools` list of the box's tools.
func (b *Box) Definitions() []map[string]any { return Definitions(b.Tools()) }

// For returns a Box offering only the named tools (an agent's), in that order, sharing this box's
// servers, settings and concurrency bound; a call to any other tool is an UnknownTool. Closing it
// does nothing: close the Box it came from.
func (b *Box) For(names ...string) (*Box, error) {
	sub := &Box{s: b.s, tools: map[string]*entry{}, slots: b.slots}
	for _, n := range names {
		e, ok := b.tools[n]
		if !ok {
			return nil, fmt.Errorf("no tool %q (the tools are: %s)", n, strings.Join(b.order, ", "))
		}
		if _, dup := sub.tools[n]; dup {
			return nil, fmt.Errorf("tool %q named twice", n)
		}
		sub.tools[n] = e
		sub.order = append(sub.order, n)
	}
	return sub, nil
}

// Settings returns the box's settings, defaults filled in.
func (b *Box) Settings() Settings { return b.s }

// Call runs a call. The model's mistakes and the tool's answers, failures included, come back in the
// Result. The error is for what no model caused: ctx ended, a server that died and could not be
// restarted, a tool that stayed unreachable through all tries; it names the tool (and its server).
func (b *Box) Call(ctx context.Context, c Call) (Result, error) {
	e, ok := b.tools[c.Name]
	if !ok {
		return Result{Failure: UnknownTool, Reason: b.unknown(c.Name)}, nil
	}
	args, err := arguments(c.Arguments)
	if err == nil {
		err = e.schema.validate(args)
	}
	if err != nil {
		return Result{Failure: BadArguments, Reason: fmt.Sprintf("tool %q: %v", c.Name, err)}, nil
	}
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return Result{}, fmt.Errorf("tool %q: %w", c.Name, ctx.Err())
	}
	defer func() { <-b.slots }()

	timeout := e.timeout
	if timeout == 0 {
		timeout = b.s.Timeout
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var res Result
	faults := 0 // tries that ended in a fault the call may have caused
	for res.Tries = 1; ; res.Tries++ {
		out, err := e.tool.Run(cctx, c.Task, args)
		res.Elapsed = time.Since(start)
		var fault *callFault
		if errors.As(err, &fault) {
			faults++
		}
		switch {
		case ctx.Err() != nil:
			return res, fmt.Errorf("tool %q: %w", c.Name, ctx.Err())
		case cctx.Err() != nil:
			res.Failure = Timeout
			res.Reason = fmt.Sprintf("tool %q: no answer within %v", c.Name, timeout)
			return res, nil
		case err == nil:
			res.Text, res.Truncated = truncate(out.Text, b.s.MaxResultChars)
			if out.IsError {
				res.Failure = ToolError
				res.Reason = fmt.Sprintf("tool %q failed: %s", c.Name, res.Text)
			}
			return res, nil
		case isStopped(err):
			return res, fmt.Errorf("tool %q: %w", c.Name, err)
		case fault != nil && (!fault.retry || (res.Tries >= b.s.Retries && faults == res.Tries)):
			res.Failure = fault.failure
			res.Reason = fmt.Sprintf("tool %q: %s", c.Name, fault.reason(res.Tries))
			return res, nil
		case res.Tries >= b.s.Retries:
			return res, fmt.Errorf("tool %q: %w (%d tries)", c.Name, err, res.Tries)
		}
		select {
		case <-time.After(backoff(res.Tries)):
		case <-cctx.Done():
		}
	}
}

// unknown is the reason of a call to a tool the box does not hold.
func (b *Box) unknown(name string) string {
	if len(b.order) == 0 {
		return fmt.Sprintf("unknown tool %q: no tools are available", name)
	}
	return fmt.Sprintf("unknown tool %q (the tools are: %s)", name, strings.Join(b.order, ", "))
}

// Close stops the MCP servers the box started (a Box from New or For has none) and returns the first
// error. Calls in flight fail.
func (b *Box) Close() error {
	var errs []error
	for _, s := range b.owned {
		errs = append(errs, s.close())
	}
	b.owned = nil
	return errors.Join(errs...)
}

// truncate cuts s to max runes, ending it with a marker that says how many were cut.
func truncate(s string, max int) (string, bool) {
	n := utf8.RuneCountInString(s)
	if n <= max {
		return s, false
	}
	r := []rune(s)
	return string(r[:max]) + fmt.Sprintf("\n…[truncated: %d of %d characters shown]", max, n), true
}

// backoff is the wait before try n+1: 100 ms, 200 ms, 400 ms… up to 2 s.
func backoff(n int) time.Duration {
	return min(100*time.Millisecond<<(n-1), 2*time.Second)
}

// callFault is an error of a tool's Run that the call itself may cause rather than the
// infrastructure: Call makes it a failed Result (the agent's) instead of an error that ends the run.
// One that may be chance (a server that died during the call) is tried again (retry), and counts as
// the call's only when every try ended in it; one that a new try would repeat is the call's at once.
type callFault struct {
	failure Failure
	retry   bool
	err     error
	// reason says what happened, after tries tries (read when Call gives up: a server's stderr by then).
	reason func(tries int) string
}

func (f *callFault) Error() string { return f.err.Error() }
func (f *callFault) Unwrap() error { return f.err }

// stopErr marks an error that no further try can mend (a server that could not be restarted, a closed
// box): Call returns it at once.
type stopErr struct{ err error }

func (e *stopErr) Error() string { return e.err.Error() }
func (e *stopErr) Unwrap() error { return e.err }

// stopped marks err as one no further try can mend.
func stopped(err error) error { return &stopErr{err} }

// isStopped reports whether err was marked by stopped.
func isStopped(err error) bool {
	var s *stopErr
	return errors.As(err, &s)
}
