package env

import (
	"context"
	"errors"
	"fmt"
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
}

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
	flow  FlowConfig
	steps map[string]*FlowStep
	match func(pred, gold string) bool
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
	return &flowOrchestra{team: t, flow: f, steps: steps, match: match}, nil
}

// Schedule is always zero: flows have no curriculum.
func (o *flowOrchestra) Schedule(int) Schedule { return Schedule{} }

// Run plays n trajectories of every task: at each step every waiting agent gets all its prompts in one
// Generate call, then the step's searches run as one batch.
func (o *flowOrchestra) Run(ctx context.Context, gen llm.Generator, tasks []Task, n int, opts RunOptions) (*Rollout, error) {
	began := time.Now()
	r, active, err := o.start(tasks, n, opts, Schedule{})
	if err != nil {
		return nil, err
	}
	next := make(map[*episode]string, len(active))
	calls := make(map[*episode]map[string]int, len(active))
	for _, e := range active {
		next[e], calls[e] = o.flow.Start, map[string]int{}
	}
	for len(active) > 0 {
		ps := make([]pending, len(active))
		for i, e := range active {
			if next[e] == o.flow.Start && len(e.traj.Calls) > 0 {
				e.turn++
			}
			ps[i] = pending{ep: e, agent: o.byName[next[e]], data: PromptData{Question: e.task.Question,
				Context: o.style.context(e.entries), Response: e.last, Turn: e.turn, MaxTurns: o.flow.MaxCalls}}
		}
		idx, err := o.generate(ctx, gen, ps, opts)
		if err != nil {
			return nil, err
		}
		var searching []*episode
		var queries []string
		for i, e := range active {
			st := o.steps[ps[i].agent.Name]
			c := &e.traj.Calls[idx[i]]
			calls[e][st.Agent]++
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
				searching = append(searching, e)
				queries = append(queries, c.Parsed)
			}
			next[e] = o.route(st, c, calls[e], len(e.traj.Calls))
		}
		if err := o.search(ctx, searching, queries); err != nil {
			return nil, err
		}
		still := active[:0]
		for _, e := range active {
			if next[e] == FlowEnd {
				o.finish(e, e.answer, e.answered, e.correct)
			} else {
				still = append(still, e)
			}
		}
		active = still
	}
	logRun(o.typ, r, began)
	return r, nil
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
