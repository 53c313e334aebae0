package env

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/drmas/drmas/pkg/env/answer"
)

// Matchers that judge a flow's final answer.
const (
	MatchQA   = "qa"   // exact match after QA normalization (answer.ExactMatch)
	MatchMath = "math" // numeric / LaTeX equality (answer.MathEqual)
)

// FlowEnd is the step target that ends a trajectory.
const FlowEnd = "end"

// FlowConfig describes a team in config, without Go: a set of steps (one per agent), each naming the
// tag it parses and where the trajectory goes next, with loop bounds. For example the math orchestra:
//
//	flow:
//	  answer: boxed
//	  match: math
//	  steps:
//	    - {agent: solver, tag: boxed, max_calls: 2, next: verifier, last: end}
//	    - agent: verifier
//	      tag: verify
//	      routes: [{when: approve, next: end}, {when: reject, next: solver}]
//	      next: end
type FlowConfig struct {
	// Start is the first agent (default: the first step's).
	Start string `mapstructure:"start"`
	// MaxCalls bounds the agent calls of one trajectory (default 8).
	MaxCalls int `mapstructure:"max_calls"`
	// Answer is the tag whose content is the team's final answer: "boxed" for \boxed{} or a tag name
	// such as "answer" (default). Every call of a step with this tag replaces the answer.
	Answer string `mapstructure:"answer"`
	// Match judges the final answer: qa (default) or math.
	Match string     `mapstructure:"match"`
	Steps []FlowStep `mapstructure:"steps"`
}

// FlowStep is what happens when one agent is called.
type FlowStep struct {
	Agent string `mapstructure:"agent"`
	// Tag is parsed from the response ("boxed", or a tag name such as "verify"); a response without it
	// is an invalid call. Empty: the whole response is the content and the call is always valid.
	Tag string `mapstructure:"tag"`
	// Routes choose the next agent by the tag's content; with routes, content outside them is invalid.
	Routes []FlowRoute `mapstructure:"routes"`
	// Next is where an unmatched or invalid output goes (default "end").
	Next string `mapstructure:"next"`
	// MaxCalls bounds this agent's calls per trajectory (0: no bound of its own). A route to an agent
	// that has used them all ends the trajectory.
	MaxCalls int `mapstructure:"max_calls"`
	// Last, when set, is where the trajectory goes after this agent's last allowed call.
	Last string `mapstructure:"last"`
	// Tool "search" sends the tag's content to the retriever; the top-k join the team's context.
	Tool string `mapstructure:"tool"`
	// Private keeps this agent's responses out of the team's context.
	Private bool `mapstructure:"private"`
	// Tools are the function tools the agent may call (built-in lookup and search, or tools of
	// tools.servers): its prompt is rendered with their definitions, each call's result returns as a
	// `tool` message and the agent is called again, until it answers without a call (docs/tools.md).
	Tools []string `mapstructure:"tools"`
	// MaxToolCalls bounds the agent's responses with tool calls per visit (default 4): a response that
	// calls a tool after them is invalid and ends the visit.
	MaxToolCalls int `mapstructure:"max_tool_calls"`
}

// DefaultMaxToolCalls is a tool step's max_tool_calls when unset.
const DefaultMaxToolCalls = 4

// FlowRoute sends the trajectory to Next when the parsed tag equals When (case-insensitive).
type FlowRoute struct {
	When string `mapstructure:"when"`
	Next string `mapstructure:"next"`
}

var tagName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

func (f FlowConfig) validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("orchestra.flow.%s: "+format, append([]any{key}, args...)...))
	}
	if len(f.Steps) == 0 {
		return errors.New("orchestra.flow.steps: a flow needs at least one step")
	}
	names := []string{}
	for i, s := range f.Steps {
		if s.Agent == "" || s.Agent == FlowEnd {
			bad(fmt.Sprintf("steps[%d].agent", i), "required, and not %q", FlowEnd)
		} else if slices.Contains(names, s.Agent) {
			bad(fmt.Sprintf("steps[%d].agent", i), "%q has two steps", s.Agent)
		}
		names = append(names, s.Agent)
	}
	target := func(key, t string) {
		if t != "" && t != FlowEnd && !slices.Contains(names, t) {
			bad(key, "%q is neither a step's agent nor %q", t, FlowEnd)
		}
	}
	answered := false
	for i, s := range f.Steps {
		key := fmt.Sprintf("steps[%d]", i)
		if s.Tag != "" && !tagName.MatchString(s.Tag) {
			bad(key+".tag", "%q is not a tag name", s.Tag)
		}
		if s.Tag == "" && (len(s.Routes) > 0 || s.Tool != "") {
			bad(key+".tag", "routes and tools need a tag to parse")
		}
		answered = answered || (s.Tag != "" && s.Tag == f.Answer)
		target(key+".next", s.Next)
		target(key+".last", s.Last)
		for j, r := range s.Routes {
			if strings.TrimSpace(r.When) == "" {
				bad(fmt.Sprintf("%s.routes[%d].when", key, j), "required")
			}
			target(fmt.Sprintf("%s.routes[%d].next", key, j), r.Next)
		}
		if s.MaxCalls < 0 {
			bad(key+".max_calls", "must be ≥ 0 (got %d)", s.MaxCalls)
		}
		if s.Tool != "" && s.Tool != "search" {
			bad(key+".tool", "unknown tool %q (search)", s.Tool)
		}
		for j, name := range s.Tools {
			if strings.TrimSpace(name) == "" || slices.Contains(s.Tools[:j], name) {
				bad(fmt.Sprintf("%s.tools[%d]", key, j), "empty or repeated tool name %q", name)
			}
		}
		if s.MaxToolCalls < 0 || s.MaxToolCalls > 64 {
			bad(key+".max_tool_calls", "must be in [0, 64], 0 = %d (got %d)", DefaultMaxToolCalls, s.MaxToolCalls)
		}
	}
	if f.Start != "" && !slices.Contains(names, f.Start) {
		bad("start", "%q is not a step's agent", f.Start)
	}
	if f.MaxCalls < 1 {
		bad("max_calls", "must be ≥ 1 (got %d)", f.MaxCalls)
	}
	if !answered {
		bad("answer", "no step parses the answer tag %q, so the team could never answer", f.Answer)
	}
	if f.Match != MatchQA && f.Match != MatchMath {
		bad("match", "must be %q or %q (got %q)", MatchQA, MatchMath, f.Match)
	}
	return errors.Join(errs...)
}

const (
	flowPromptPaper = "# Task\n{{.Question}}\n{{- if .Context}}\n\n# Your team's outputs so far\n{{.Context}}\n{{- end}}"
	flowPromptToy   = "{{.Question}}{{.Context}}"
)

// flowOrchestra runs a FlowConfig.
type flowOrchestra struct {
	*team
	flow    FlowConfig
	steps   map[string]*FlowStep
	match   func(pred, gold string) bool
	tools   Toolbox               // the function tools of the steps with tools
	parsers map[string]ToolParser // per agent with tools: its model family's tool-call format
}

func newFlow(s setup) (Orchestra, error) {
	f := s.cfg.Flow
	if f.Start == "" {
		f.Start = f.Steps[0].Agent
	}
	roles := make([]Role, len(f.Steps))
	steps := map[string]*FlowStep{}
	for i := range f.Steps {
		st := &f.Steps[i]
		if st.Next == "" {
			st.Next = FlowEnd
		}
		if st.Tool == "search" && s.retr == nil {
			return nil, fmt.Errorf("orchestra.flow.steps[%d].tool: search needs a retriever", i)
		}
		var values []string
		for _, r := range st.Routes {
			values = append(values, strings.ToLower(strings.TrimSpace(r.When)))
		}
		parse := func(resp string) (string, bool) { return strings.TrimSpace(resp), true }
		if st.Tag != "" {
			parse = parserFor(st.Tag, values...)
		}
		roles[i] = Role{Name: st.Agent, Parse: parse,
			Prompts: map[string]string{PromptsPaper: flowPromptPaper, PromptsToy: flowPromptToy}}
		steps[st.Agent] = st
	}
	t, err := newTeam("flow", s, roles)
	if err != nil {
		return nil, err
	}
	match := answer.MathEqual
	if f.Match == MatchQA {
		match = func(pred, gold string) bool { return answer.ExactMatch(pred, []string{gold}) }
	}
	o := &flowOrchestra{team: t, flow: f, steps: steps, match: match, tools: s.tools, parsers: map[string]ToolParser{}}
	for i, st := range f.Steps {
		if len(st.Tools) == 0 {
			continue
		}
		if err := o.bindTools(i, &f.Steps[i]); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// bindTools gives the agent of step i its tools' definitions (the chat template's `tools`) and its
// tool-call parser.
func (o *flowOrchestra) bindTools(i int, st *FlowStep) error {
	if st.MaxToolCalls == 0 {
		st.MaxToolCalls = DefaultMaxToolCalls
	}
	if o.tools == nil {
		return fmt.Errorf("orchestra.flow.steps[%d].tools: the step calls tools, but the orchestra was given no toolbox (pkg/team opens the team's: WithTools)", i)
	}
	specs, err := o.tools.Specs(st.Tools)
	if err != nil {
		return fmt.Errorf("orchestra.flow.steps[%d].tools: %w", i, err)
	}
	a := o.byName[st.Agent]
	kw := maps.Clone(a.ChatTemplateKwargs)
	if kw == nil {
		kw = map[string]any{}
	}
	kw["tools"] = specs
	a.ChatTemplateKwargs = kw
	parse, err := toolParser(a.ToolFormat)
	if err != nil {
		return fmt.Errorf("agents: %s: tool_format: %w", a.Name, err)
	}
	o.parsers[a.Name] = parse
	return nil
}

// Run plays n trajectories of every task: at each step every waiting agent gets all its prompts in one
// Generate call, then the step's searches run as one batch.
func (o *flowOrchestra) Run(ctx context.Context, gen llm.Generator, tasks []Task, n int, opts RunOptions) (*Rollout, error) {
	began := time.Now()
	r, active, err := o.start(tasks, n, opts, Schedule{})
	if err != nil {
		return nil, err
	}
	fs := flowState{
		next:  make(map[*episode]string, len(active)),
		calls: make(map[*episode]map[string]int, len(active)),
		tools: map[*episode]*toolTurn{},
	}
	for _, e := range active {
		fs.next[e], fs.calls[e] = o.flow.Start, map[string]int{}
	}
	for len(active) > 0 {
		ps := o.prompts(active, &fs)
		idx, err := o.generate(ctx, gen, ps, opts)
		if err != nil {
			return nil, err
		}
		w := o.take(active, ps, idx, &fs)
		if err := o.search(ctx, w.searching, w.queries); err != nil {
			return nil, err
		}
		results, err := o.runTools(ctx, o.tools, w.calling, w.toolCalls)
		if err != nil {
			return nil, err
		}
		for i, msgs := range results {
			fs.tools[w.calling[i]].convo = append(fs.tools[w.calling[i]].convo, msgs...)
		}
		active = o.finishWhere(active, func(_ int, e *episode) bool { return fs.next[e] == FlowEnd })
	}
	logRun(o.typ, r, began)
	return r, nil
}

// flowState is a flow's state across a Run, per episode: the step it goes to next, its calls per
// agent, and the visit of a tool step in progress (nil: none).
type flowState struct {
	next  map[*episode]string
	calls map[*episode]map[string]int
	tools map[*episode]*toolTurn
}

// flowWork is what a round of calls leaves to do: the searches to run (episodes and their queries)
// and the tool calls (episodes and their calls).
type flowWork struct {
	searching, calling []*episode
	queries            []string
	toolCalls          [][]llm.ToolCall
}

// prompts are the calls of a round: each active episode's next step, with the conversation of its
// tool visit when one is in progress (a turn begins when the flow comes back to its start).
func (o *flowOrchestra) prompts(active []*episode, fs *flowState) []pending {
	ps := make([]pending, len(active))
	for i, e := range active {
		if fs.next[e] == o.flow.Start && len(e.traj.Calls) > 0 && fs.tools[e] == nil {
			e.turn++
		}
		ps[i] = pending{ep: e, agent: o.byName[fs.next[e]], data: PromptData{Question: e.task.Question,
			Context: o.style.context(e.entries), Response: e.last, Turn: e.turn, MaxTurns: o.flow.MaxCalls}}
		if tt := fs.tools[e]; tt != nil {
			ps[i].messages = tt.convo
		}
	}
	return ps
}

// take reads the round's calls (idx: each pending call's index in its trajectory): a tool step's
// tool calls go on its visit; any other call counts, answers (the answer step: the episode's reward),
// enters the team's context unless private, queries the retriever from a search step, and routes
// the episode to its next step.
func (o *flowOrchestra) take(active []*episode, ps []pending, idx []int, fs *flowState) flowWork {
	var w flowWork
	for i, e := range active {
		st := o.steps[ps[i].agent.Name]
		c := &e.traj.Calls[idx[i]]
		if len(st.Tools) > 0 {
			if tc := o.toolCalls(e, st, c, fs.tools); tc != nil {
				if len(e.traj.Calls) >= o.flow.MaxCalls {
					fs.next[e] = FlowEnd
				} else {
					w.calling, w.toolCalls = append(w.calling, e), append(w.toolCalls, tc)
				}
				continue
			}
		}
		fs.calls[e][st.Agent]++
		e.last = c.Response
		if st.Tag != "" && st.Tag == o.flow.Answer {
			e.answer, e.answered = c.Parsed, c.Valid
			e.correct = c.Valid && anyMatch(o.match, c.Parsed, e.task.Answers)
			c.RoleReward = b2f(e.correct)
		}
		if !st.Private {
			e.entries = append(e.entries, entry{agent: st.Agent, text: c.Response, verdict: len(st.Routes) > 0})
		}
		if st.Tool == "search" && c.Valid {
			w.searching = append(w.searching, e)
			w.queries = append(w.queries, c.Parsed)
		}
		fs.next[e] = o.route(st, c, fs.calls[e], len(e.traj.Calls))
	}
	return w
}

// toolCalls reads the latest call c of a tool step: the tool calls to run (the visit goes on), or nil
// when the visit ends (an answer without a call, a malformed call, a call past max_tool_calls: the
// last two make c invalid, with the reason in c.Tools). tools holds the visits in progress.
func (o *flowOrchestra) toolCalls(e *episode, st *FlowStep, c *Call, tools map[*episode]*toolTurn) []llm.ToolCall {
	content, tcs, err := o.parsers[st.Agent](c.Response)
	tt := tools[e]
	switch {
	case err == nil && len(tcs) == 0:
		delete(tools, e)
		return nil
	case err != nil:
		c.Tools = []ToolUse{{Error: "malformed tool call: " + err.Error()}}
	case tt != nil && tt.turns >= st.MaxToolCalls:
		c.Tools = []ToolUse{{Name: tcs[0].Function.Name, Arguments: tcs[0].Function.Arguments,
			Error: fmt.Sprintf("%v (%d)", errToolLimit, st.MaxToolCalls)}}
	default:
		if tt == nil {
			tt = &toolTurn{convo: slices.Clone(c.Messages)}
			tools[e] = tt
		}
		tcs = withIDs(tcs, len(e.traj.Calls))
		tt.convo = append(tt.convo, llm.Message{Role: "assistant", Content: content, ToolCalls: tcs})
		tt.turns++
		c.Parsed, c.Valid = "", true
		return tcs
	}
	c.Parsed, c.Valid = "", false
	delete(tools, e)
	return nil
}

// route picks the agent after a call of step st, given the calls made so far.
func (o *flowOrchestra) route(st *FlowStep, c *Call, calls map[string]int, total int) string {
	to := st.Next
	if c.Valid {
		for _, r := range st.Routes {
			if strings.EqualFold(strings.TrimSpace(r.When), c.Parsed) {
				to = r.Next
				break
			}
		}
	}
	if st.Last != "" && st.MaxCalls > 0 && calls[st.Agent] >= st.MaxCalls {
		to = st.Last
	}
	if total >= o.flow.MaxCalls {
		return FlowEnd
	}
	if to != FlowEnd {
		if s := o.steps[to]; s.MaxCalls > 0 && calls[to] >= s.MaxCalls {
			return FlowEnd
		}
	}
	return to
}
