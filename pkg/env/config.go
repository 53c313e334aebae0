package env

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/llm"
)

// OrchestraConfig is the `orchestra:` section of a run config. Decode YAML over DefaultOrchestraConfig.
type OrchestraConfig struct {
	// Type names a registered orchestra: math, search or flow.
	Type string `mapstructure:"type"`
	// MaxTurns bounds the search orchestra's turns (default 4).
	MaxTurns int `mapstructure:"max_turns"`
	// MaxLoopNum bounds the math orchestra's Solver calls (default 2: S,V or S,V,S).
	MaxLoopNum int `mapstructure:"max_loop_num"`
	// TopK is the number of documents a search returns (default 3).
	TopK int `mapstructure:"topk"`
	// InvalidActionPenalty is subtracted from the score of a malformed call. Unset means the
	// orchestra's default (math 0.1, search 0.01, flow 0.1); see Penalty.
	InvalidActionPenalty *float64 `mapstructure:"invalid_action_penalty"`
	// Prompts picks the built-in prompt set: "paper" (the Dr. MAS role prompts) or "toy" (a few
	// tokens, for tiny models). An agent's own `prompt` overrides it.
	Prompts string `mapstructure:"prompts"`
	// Curriculum applies to the search orchestra only; off by default.
	Curriculum CurriculumConfig `mapstructure:"curriculum"`
	// Flow describes the team of a `flow` orchestra.
	Flow FlowConfig `mapstructure:"flow"`
	// Dial sets the `dial` orchestra's call pattern (docs/dial.md).
	Dial DialConfig `mapstructure:"dial"`
}

// Prompt sets.
const (
	PromptsPaper = "paper"
	PromptsToy   = "toy"
)

// DefaultOrchestraConfig returns the defaults that YAML is decoded over. Type is left empty: a config
// must name its orchestra.
func DefaultOrchestraConfig() OrchestraConfig {
	return OrchestraConfig{MaxTurns: 4, MaxLoopNum: 2, TopK: 3, Prompts: PromptsPaper,
		Flow: FlowConfig{MaxCalls: 8, Answer: "answer", Match: MatchQA}, Dial: DefaultDialConfig()}
}

// Penalty returns the invalid-action penalty in force: the configured one, else the type's default.
func (c OrchestraConfig) Penalty() float64 {
	if c.InvalidActionPenalty != nil {
		return *c.InvalidActionPenalty
	}
	if o, ok := orchestras[c.Type]; ok {
		return o.penalty
	}
	return 0
}

// Validate checks the section and names the first bad key of each problem found.
func (c OrchestraConfig) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("orchestra.%s: "+format, append([]any{key}, args...)...))
	}
	if _, ok := orchestras[c.Type]; !ok {
		if c.Type == "" {
			bad("type", "required (one of %s)", strings.Join(OrchestraTypes(), ", "))
		} else {
			bad("type", "unknown orchestra %q (one of %s)", c.Type, strings.Join(OrchestraTypes(), ", "))
		}
	}
	if c.MaxTurns < 1 {
		bad("max_turns", "must be ≥ 1 (got %d)", c.MaxTurns)
	}
	if c.MaxLoopNum < 1 {
		bad("max_loop_num", "must be ≥ 1 (got %d)", c.MaxLoopNum)
	}
	if c.TopK < 1 {
		bad("topk", "must be ≥ 1 (got %d)", c.TopK)
	}
	if p := c.InvalidActionPenalty; p != nil && *p < 0 {
		bad("invalid_action_penalty", "must be ≥ 0 (got %g)", *p)
	}
	if c.Prompts != PromptsPaper && c.Prompts != PromptsToy {
		bad("prompts", "must be %q or %q (got %q)", PromptsPaper, PromptsToy, c.Prompts)
	}
	for _, r := range []struct {
		key string
		r   Ramp
	}{{"curriculum.inject", c.Curriculum.Inject}, {"curriculum.force_search", c.Curriculum.ForceSearch}} {
		if err := r.r.validate("orchestra." + r.key); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Curriculum.active() && c.Type != "search" {
		bad("curriculum", "only the search orchestra has a curriculum (type is %q)", c.Type)
	}
	if c.Type == "flow" {
		if err := c.Flow.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Type == "dial" {
		if err := c.Dial.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CurriculumConfig holds the search orchestra's training curriculum (docs/toy-tasks.md). Evaluation runs
// ignore it. Both probabilities are drawn once per episode.
type CurriculumConfig struct {
	// Inject is the probability that the task's needed fact (Task.Support) is put into the
	// Answerer's context as an <information> block.
	Inject Ramp `mapstructure:"inject"`
	// ForceSearch is the probability that turn 1 skips the Verifier and goes straight to the Searcher.
	ForceSearch Ramp `mapstructure:"force_search"`
}

func (c CurriculumConfig) active() bool { return c.Inject.P0 > 0 || c.ForceSearch.P0 > 0 }

// At returns the curriculum's probabilities at a training iteration.
func (c CurriculumConfig) At(iteration int) Schedule {
	return Schedule{InjectP: c.Inject.At(iteration), ForceSearchP: c.ForceSearch.At(iteration)}
}

// Ramp is a probability held at P0 for the first Hold iterations, then annealed linearly to 0 over
// the next Decay iterations: p(i) = P0 for i ≤ Hold, P0·max(0, 1 − (i−Hold)/Decay) after.
type Ramp struct {
	P0    float64 `mapstructure:"p0"`
	Hold  int     `mapstructure:"hold"`
	Decay int     `mapstructure:"decay"`
}

// At evaluates the ramp at an iteration.
func (r Ramp) At(iteration int) float64 {
	if r.P0 <= 0 {
		return 0
	}
	if iteration <= r.Hold {
		return r.P0
	}
	if r.Decay <= 0 {
		return 0
	}
	return r.P0 * max(0, 1-float64(iteration-r.Hold)/float64(r.Decay))
}

func (r Ramp) validate(key string) error {
	switch {
	case r.P0 < 0 || r.P0 > 1:
		return fmt.Errorf("%s.p0: must be in [0, 1] (got %g)", key, r.P0)
	case r.Hold < 0:
		return fmt.Errorf("%s.hold: must be ≥ 0 (got %d)", key, r.Hold)
	case r.Decay < 0:
		return fmt.Errorf("%s.decay: must be ≥ 0 (got %d)", key, r.Decay)
	case r.P0 > 0 && r.Hold+r.Decay == 0:
		return fmt.Errorf("%s: p0 > 0 needs hold or decay ≥ 1, else it is never applied", key)
	}
	return nil
}

// Schedule is the curriculum in force at one iteration.
type Schedule struct {
	InjectP      float64 `json:"inject_p"`
	ForceSearchP float64 `json:"force_search_p"`
}

// Metrics returns the schedule as metrics.jsonl keys.
func (s Schedule) Metrics() map[string]float64 {
	return map[string]float64{"curriculum/inject_p": s.InjectP, "curriculum/force_search_p": s.ForceSearchP}
}

// AgentConfig is one entry of the `agents:` list: a role of the orchestra played by a model.
type AgentConfig struct {
	// Name is the role (math: solver, verifier; search: verifier, searcher, answerer; flow: any).
	Name string `mapstructure:"name"`
	// Model is the id of the model that plays the agent; agents with the same id share weights.
	Model    string         `mapstructure:"model"`
	Sampling SamplingConfig `mapstructure:"sampling"`
	// Prompt, when set, is a text/template over PromptData that replaces the role's built-in prompt.
	Prompt string `mapstructure:"prompt"`
	// ChatTemplateKwargs are extra variables for the model's chat template on this agent's requests,
	// as vLLM's and SGLang's chat_template_kwargs (enable_thinking: false, date_string, tools, ...).
	ChatTemplateKwargs map[string]any `mapstructure:"chat_template_kwargs"`
	Reward             RewardConfig   `mapstructure:"reward"`
	// ToolFormat is how the agent's model writes tool calls (a flow step with tools): hermes (Qwen's
	// <tool_call>{…}</tool_call>) or llama3_json (Llama 3.1's JSON call); "" = its model family's.
	ToolFormat string `mapstructure:"tool_format"`
	// MaxPromptTokens bounds every prompt of the agent's calls (data.max_prompt_length, set by
	// pkg/team; 0 = the model's context): a later turn whose prompt grew past it is an overlong
	// call, invalid with nothing generated.
	MaxPromptTokens int `mapstructure:"-"`
}

// SamplingConfig is an agent's decoding settings. Zero values mean the defaults noted.
type SamplingConfig struct {
	Temperature  *float64 `mapstructure:"temperature"`    // default 1.0; 0 = greedy
	TopP         float64  `mapstructure:"top_p"`          // 0 or 1 = off (default)
	TopK         int      `mapstructure:"top_k"`          // 0 = off (default)
	MaxNewTokens int      `mapstructure:"max_new_tokens"` // default 512
	Stop         []string `mapstructure:"stop"`
}

// Default sampling values.
const (
	DefaultTemperature  = 1.0
	DefaultMaxNewTokens = 512
)

// Resolve returns the seam's Sampling with defaults filled in (Seed is set per request).
func (s SamplingConfig) Resolve() llm.Sampling {
	out := llm.Sampling{Temperature: DefaultTemperature, TopP: s.TopP, TopK: s.TopK,
		MaxNewTokens: s.MaxNewTokens, Stop: slices.Clone(s.Stop)}
	if s.Temperature != nil {
		out.Temperature = *s.Temperature
	}
	if out.MaxNewTokens == 0 {
		out.MaxNewTokens = DefaultMaxNewTokens
	}
	return out
}

// RewardConfig mixes an agent's role reward into its score:
// score = (1 − role_weight)·team + role_weight·role − penalty·[call invalid].
// The role reward depends on the orchestra: solver and answerer — this call's own answer is right;
// verifier — its verdict matched the truth (math: approve ⇔ the solution is right; search: yes ⇔ the
// needed fact is in the context); searcher — its retrieval returned the needed fact. The default,
// role_weight 0, is the paper's shared outcome reward.
type RewardConfig struct {
	RoleWeight float64 `mapstructure:"role_weight"`
}

// ValidateAgents checks the `agents:` list, naming the bad key (agents[i].field).
func ValidateAgents(agents []AgentConfig) error {
	if len(agents) == 0 {
		return errors.New("agents: at least one agent is required")
	}
	var errs []error
	seen := map[string]int{}
	for i, a := range agents {
		key := fmt.Sprintf("agents[%d]", i)
		bad := func(field, format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s.%s: "+format, append([]any{key, field}, args...)...))
		}
		if a.Name == "" {
			bad("name", "required")
		} else if j, dup := seen[a.Name]; dup {
			bad("name", "%q already used by agents[%d]", a.Name, j)
		} else {
			seen[a.Name] = i
		}
		for _, p := range a.Sampling.Resolve().Check() { // the resolved settings: 0 = the default
			bad("sampling."+p.Key, "%s", p.Msg)
		}
		if w := a.Reward.RoleWeight; !(w >= 0 && w <= 1) {
			bad("reward.role_weight", "must be in [0, 1] (got %g)", w)
		}
		if _, err := toolParser(a.ToolFormat); err != nil {
			bad("tool_format", "%v", err)
		}
	}
	return errors.Join(errs...)
}
