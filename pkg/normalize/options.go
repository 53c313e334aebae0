package normalize

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Values of Options.Mean and Options.Std.
const (
	Global = "global" // statistics of the prompt group (uid), over its trajectory averages
	Agent  = "agent"  // statistics of the (uid, agent) group, over that agent's calls
	None   = "none"   // Std only: no scaling, A = s − μ (Dr. GRPO)
)

// Values of Options.Weighting.
const (
	Step       = "step"       // every call of agent k counts once (the paper's Eq. 5)
	Trajectory = "trajectory" // every trajectory counts once per agent, its calls weighted 1/n_{τ,k}
)

// Values of Options.Group: what the agent-wise statistics μ_k, σ_k are taken over.
const (
	ByAgent     = "agent"      // the (uid, agent) group: every call of agent k in the prompt group (Dr. MAS)
	ByAgentTurn = "agent-turn" // the (uid, agent, turn) group: agent k's t-th calls of the trajectories (AT-GRPO)
)

// Values of Options.Global: what the global statistics μ, σ are taken over, and which score the
// purely global combinations use.
const (
	OverTrajectories = "trajectory" // the N trajectory averages s̄_τ (the reference code's GRPO)
	OverCalls        = "call"       // every call of the prompt group once, each with its own score (grpo-call)
)

// DefaultEps is the ε added to σ in every standardized advantage, as in the paper and verl.
const DefaultEps = 1e-6

// MinEps is the smallest ε Validate accepts. With |score| ≤ MaxScore it keeps (s − μ)/(σ + ε) finite
// even for a mixed combo whose σ is 0 while s − μ is not.
const MinEps = 1e-50

// Options selects the estimator. Build it from a preset (GRPO, GRPOCall, DrMAS, ATGRPO, RoleBaseline
// or Preset) and change fields from there: the zero value is not valid (Eps 0, empty names).
type Options struct {
	// Mean is where μ comes from: Global (the uid's trajectory averages) or Agent (agent k's calls in the uid).
	Mean string `json:"mean" yaml:"mean" mapstructure:"mean"`
	// Std is where σ comes from: Global, Agent or None (no scaling).
	Std string `json:"std" yaml:"std" mapstructure:"std"`
	// Weighting is how agent k's calls count in μ_k and σ_k: Step or Trajectory. It changes nothing
	// when neither Mean nor Std is Agent.
	Weighting string `json:"weighting" yaml:"weighting" mapstructure:"weighting"`
	// Eps is ε in A = (s − μ)/(σ + ε); it must lie in [MinEps, ∞).
	Eps float64 `json:"eps" yaml:"eps" mapstructure:"eps"`
	// Unbiased selects the (n−1) standard deviation (the reference code); false is the population std
	// the paper writes.
	Unbiased bool `json:"unbiased" yaml:"unbiased" mapstructure:"unbiased"`
	// MinStd floors σ: the σ used is max(σ, MinStd). 0 (the paper) disables the floor. It guards
	// against the groups whose only variance is a small invalid-action penalty.
	MinStd float64 `json:"min_std" yaml:"min_std" mapstructure:"min_std"`
	// Group is what μ_k and σ_k are taken over: ByAgent (the default) or ByAgentTurn. It changes nothing
	// when neither Mean nor Std is Agent.
	Group string `json:"group" yaml:"group" mapstructure:"group"`
	// Global is what μ and σ are taken over: OverTrajectories (the default) or OverCalls.
	Global string `json:"global" yaml:"global" mapstructure:"global"`
	// Agents gives some agents an estimator of their own, by agent name (as rllm lets each role choose
	// its advantage estimator); the other agents use these options. An override is complete options
	// without Agents of its own. The Lemma 4.2 inflation factors and the group counts of Stats follow
	// the top-level options.
	Agents map[string]Options `json:"agents,omitempty" yaml:"agents,omitempty" mapstructure:"agents"`
}

// GRPO returns vanilla GRPO as the reference code computes it: A = (s̄_τ − μ)/(σ + ε) with μ, σ over the
// uid's trajectory averages, so every call of a trajectory shares one advantage.
func GRPO() Options {
	return Options{Mean: Global, Std: Global, Weighting: Step, Eps: DefaultEps, Unbiased: true, Group: ByAgent, Global: OverTrajectories}
}

// GRPOCall returns global GRPO on per-call scores: A = (sᵢ − μ)/(σ + ε) with μ, σ over all the calls of
// the uid, each call once. Every call keeps its own score, as under Dr. MAS, so the two differ only in
// the baseline and the scale (and not in credit assignment, as GRPO and Dr. MAS do with role rewards).
func GRPOCall() Options {
	o := GRPO()
	o.Global = OverCalls
	return o
}

// DrMAS returns Dr. MAS agent-wise normalization: A = (s − μ_k)/(σ_k + ε), step-weighted.
// It is the default of drmas.
func DrMAS() Options {
	return Options{Mean: Agent, Std: Agent, Weighting: Step, Eps: DefaultEps, Unbiased: true, Group: ByAgent, Global: OverTrajectories}
}

// ATGRPO returns agent- and turn-wise grouping (AT-GRPO, arXiv 2510.11062): A = (s − μ_{k,t})/(σ_{k,t} + ε)
// with μ_{k,t}, σ_{k,t} over the t-th calls of agent k in the uid's trajectories (see turnIndex).
func ATGRPO() Options {
	o := DrMAS()
	o.Group = ByAgentTurn
	return o
}

// RoleBaseline returns a per-role baseline without scaling (SPIRAL's role-conditioned advantage
// estimation, arXiv 2506.24119): A = s − μ_k. SPIRAL divides by nothing: its advantage is
// R_p(τ) − b_{G,p}, b_{G,p} an exponential moving average of role p's return in game G over past games.
// Here the baseline is the mean of agent k's calls in the prompt group (uid), the same call's score
// included, so the estimator is stateless; the table 3 combination with the global scale,
// (s − μ_k)/(σ + ε), stays available as mean: agent, std: global.
func RoleBaseline() Options {
	o := DrMAS()
	o.Std = None
	return o
}

// presets are the named estimators: a new one is its function above and one line here (in the
// order help texts and drmas estimators list them).
var presets = []struct {
	name string
	opts func() Options
}{
	{"grpo", GRPO},
	{"grpo-call", GRPOCall},
	{"drmas", DrMAS},
	{"at-grpo", ATGRPO},
	{"role-baseline", RoleBaseline},
}

// Presets lists the names Preset accepts.
func Presets() []string {
	out := make([]string, len(presets))
	for i, p := range presets {
		out[i] = p.name
	}
	return out
}

// Preset returns the options of a named estimator: grpo, grpo-call, drmas, at-grpo or role-baseline.
func Preset(name string) (Options, error) {
	for _, p := range presets {
		if p.name == name {
			return p.opts(), nil
		}
	}
	return Options{}, fmt.Errorf("normalization preset %q: want one of %s", name, strings.Join(Presets(), ", "))
}

// Validate reports the first bad field, by its config key (the rules are check.go's).
func (o Options) Validate() error {
	for _, f := range nameFields {
		if e := checkName(f.key, f.opt(&o), f.allowed); e != nil {
			return e
		}
	}
	if e := checkEps(o.Eps); e != nil {
		return e
	}
	if e := checkMinStd(o.MinStd); e != nil {
		return e
	}
	for _, name := range slices.Sorted(maps.Keys(o.Agents)) {
		a := o.Agents[name]
		if len(a.Agents) > 0 {
			return fmt.Errorf("agents.%s: an override has no agents of its own", name)
		}
		if err := a.Validate(); err != nil {
			return fmt.Errorf("agents.%s: %w", name, err)
		}
	}
	return nil
}

// For returns the options agent uses: its override, or o.
func (o Options) For(agent string) Options {
	if a, ok := o.Agents[agent]; ok {
		return a
	}
	return o
}

// String names the combination, e.g. "mean=agent std=agent weighting=step group=agent global=trajectory
// eps=1e-06 unbiased min_std=0", followed by the overrides as "; agent: …" in name order.
func (o Options) String() string {
	std := "unbiased"
	if !o.Unbiased {
		std = "population"
	}
	s := fmt.Sprintf("mean=%s std=%s weighting=%s group=%s global=%s eps=%g %s min_std=%g",
		o.Mean, o.Std, o.Weighting, o.Group, o.Global, o.Eps, std, o.MinStd)
	for _, name := range slices.Sorted(maps.Keys(o.Agents)) {
		s += "; " + name + ": " + o.Agents[name].String()
	}
	return s
}

// usesAgentStats reports whether μ_k or σ_k enters the advantage.
func (o Options) usesAgentStats() bool { return o.Mean == Agent || o.Std == Agent }

// usesTrajectoryAverages reports whether the s in the formula is the trajectory average s̄_τ rather than
// the call's own score. Only the purely global combos over trajectory averages do that: global GRPO
// shares one advantage per trajectory (as the reference code does), while grpo-call and every variant
// with an agent-wise statistic work on per-call scores (the paper's Table 3).
func (o Options) usesTrajectoryAverages() bool {
	return !o.usesAgentStats() && o.Global == OverTrajectories
}

// WithAgent returns o with agent on the named preset, taking ε, the std estimator and min_std from o:
// the shape of a per-agent override in the config and on the command line.
func (o Options) WithAgent(agent, preset string) (Options, error) {
	if agent == "" {
		return o, fmt.Errorf("agent override %q: empty agent name", agent+"="+preset)
	}
	p, err := Preset(preset)
	if err != nil {
		return o, fmt.Errorf("agent %s: %w", agent, err)
	}
	p.Eps, p.Unbiased, p.MinStd = o.Eps, o.Unbiased, o.MinStd
	agents := make(map[string]Options, len(o.Agents)+1)
	maps.Copy(agents, o.Agents)
	agents[agent] = p
	o.Agents = agents
	return o, nil
}

// ParseEstimator reads an estimator spec, a preset followed by any per-agent overrides joined with
// "+": "drmas", or "drmas+searcher=grpo" (Dr. MAS, with the searcher on GRPO). ε, the std estimator
// and min_std come from base for every part. The spec is the estimator's name.
func ParseEstimator(spec string, base Options) (Estimator, error) {
	parts := strings.Split(spec, "+")
	agents, err := ParseAgentSpecs(parts[1:])
	if err != nil {
		return Estimator{}, fmt.Errorf("estimator %q: %w", spec, err)
	}
	s := Spec{Preset: parts[0], Eps: base.Eps, PopulationStd: !base.Unbiased, MinStd: base.MinStd, Agents: agents}
	o, err := s.Options()
	if err != nil {
		return Estimator{}, fmt.Errorf("estimator %q: %w", spec, err)
	}
	return Estimator{Name: spec, Options: o}, nil
}
