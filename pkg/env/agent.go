package env

import (
	"fmt"
	"slices"
	"strings"
	"text/template"

	"github.com/drmas/drmas/pkg/llm"
)

// PromptData is what a role prompt template sees, e.g. `{{.Question}}{{.Context}}`.
type PromptData struct {
	Question string // the task's question
	Context  string // the team's context so far: earlier outputs and retrieved <information>
	Response string // the response under review: the team's latest (math verifier: the Solver's)
	Turn     int    // 1-based: the search turn, or the Solver attempt in math
	MaxTurns int    // the orchestra's bound on turns (search) or Solver calls (math)
}

// Role is what an orchestra needs from one of its agents: a built-in prompt per prompt set and a
// parser of its output. Each orchestra declares its roles next to its code.
type Role struct {
	Name    string
	Prompts map[string]string // prompt set (PromptsPaper, PromptsToy) → text/template
	Parse   Parser
}

// Agent is a role bound to its config: the model that plays it, its sampling and its prompt.
type Agent struct {
	Name       string
	Model      string
	Sampling   llm.Sampling
	RoleWeight float64
	// ChatTemplateKwargs go with each of the agent's requests (llm.Request.ChatTemplateKwargs).
	ChatTemplateKwargs map[string]any
	ToolFormat         string // AgentConfig.ToolFormat
	MaxPromptTokens    int    // AgentConfig.MaxPromptTokens
	Parse              Parser
	prompt             *template.Template
}

// Render fills the agent's prompt template.
func (a *Agent) Render(d PromptData) (string, error) {
	var b strings.Builder
	if err := a.prompt.Execute(&b, d); err != nil {
		return "", fmt.Errorf("render %s prompt: %w", a.Name, err)
	}
	return b.String(), nil
}

// bindAgents pairs each role with the agent config of the same name. Every role needs an agent and
// every agent a role; the result follows the config order.
func bindAgents(typ string, roles []Role, cfgs []AgentConfig, promptSet string) ([]*Agent, error) {
	if err := ValidateAgents(cfgs); err != nil {
		return nil, err
	}
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = r.Name
	}
	agents := make([]*Agent, 0, len(cfgs))
	for i, c := range cfgs {
		j := slices.Index(names, c.Name)
		if j < 0 {
			return nil, fmt.Errorf("agents[%d].name: the %s orchestra has no role %q (roles: %s)",
				i, typ, c.Name, strings.Join(names, ", "))
		}
		text := c.Prompt
		if text == "" {
			text = roles[j].Prompts[promptSet]
		}
		a, err := newAgent(c, text, roles[j].Parse)
		if err != nil {
			return nil, fmt.Errorf("agents[%d].prompt: %w", i, err)
		}
		agents = append(agents, a)
	}
	for _, n := range names {
		if !slices.ContainsFunc(cfgs, func(c AgentConfig) bool { return c.Name == n }) {
			return nil, fmt.Errorf("agents: the %s orchestra needs an agent named %q (roles: %s)",
				typ, n, strings.Join(names, ", "))
		}
	}
	return agents, nil
}

// newAgent compiles an agent's prompt and checks it renders.
func newAgent(c AgentConfig, text string, parse Parser) (*Agent, error) {
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("no prompt for agent %q: set one", c.Name)
	}
	t, err := template.New(c.Name).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, err
	}
	a := &Agent{Name: c.Name, Model: c.Model, Sampling: c.Sampling.Resolve(),
		RoleWeight: c.Reward.RoleWeight, ChatTemplateKwargs: c.ChatTemplateKwargs, ToolFormat: c.ToolFormat, MaxPromptTokens: c.MaxPromptTokens, Parse: parse, prompt: t}
	if _, err := a.Render(PromptData{Question: "q", Context: "c", Response: "r", Turn: 1, MaxTurns: 1}); err != nil {
		return nil, err
	}
	return a, nil
}

// entry is one item of a team's context: an agent's output or a tool's.
type entry struct {
	agent   string // "" for tool output
	text    string
	verdict bool // a routing verdict; the toy prompt set leaves these out of the context
}

// style formats contexts and retrieved documents for a prompt set.
type style struct{ toy bool }

// context renders a team's context.
func (s style) context(entries []entry) string {
	var b strings.Builder
	for _, e := range entries {
		switch {
		case s.toy && e.verdict:
		case s.toy:
			b.WriteString(e.text)
		case e.agent == "":
			b.WriteString(e.text)
			b.WriteByte('\n')
		default:
			fmt.Fprintf(&b, "The output of %q: %s\n", e.agent, e.text)
		}
	}
	return b.String()
}

// information renders retrieved documents as an <information> block.
func (s style) information(docs []Doc) string {
	var b strings.Builder
	b.WriteString(TagInfoOpen)
	for i, d := range docs {
		if s.toy {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(d.Contents)
		} else {
			fmt.Fprintf(&b, "\nDoc %d: %s", i+1, d.Contents)
		}
	}
	if !s.toy {
		b.WriteByte('\n')
	}
	b.WriteString(TagInfoClose)
	return b.String()
}
