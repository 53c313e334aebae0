package normalize

import (
	"fmt"
	"math"
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

// DefaultEps is the ε added to σ in every standardized advantage, as in the paper and verl.
const DefaultEps = 1e-6

// MinEps is the smallest ε Validate accepts. With |score| ≤ MaxScore it keeps (s − μ)/(σ + ε) finite
// even for a mixed combo whose σ is 0 while s − μ is not.
const MinEps = 1e-50

// Options selects the estimator. Build it from GRPO, DrMAS or Preset and change fields from there:
// the zero value is not valid (Eps 0, empty names).
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
}

// GRPO returns vanilla GRPO: A = (s̄_τ − μ)/(σ + ε) with μ, σ over the uid's trajectory averages.
func GRPO() Options {
	return Options{Mean: Global, Std: Global, Weighting: Step, Eps: DefaultEps, Unbiased: true}
}

// DrMAS returns Dr. MAS agent-wise normalization: A = (s − μ_k)/(σ_k + ε), step-weighted.
// It is the default of drmas.
func DrMAS() Options {
	return Options{Mean: Agent, Std: Agent, Weighting: Step, Eps: DefaultEps, Unbiased: true}
}

// Presets lists the names Preset accepts.
var Presets = []string{"grpo", "drmas"}

// Preset returns the options named "grpo" or "drmas".
func Preset(name string) (Options, error) {
	switch name {
	case "grpo":
		return GRPO(), nil
	case "drmas":
		return DrMAS(), nil
	}
	return Options{}, fmt.Errorf("normalization preset %q: want grpo or drmas", name)
}

// Validate reports the first bad field, by its config key.
func (o Options) Validate() error {
	if o.Mean != Global && o.Mean != Agent {
		return fmt.Errorf("mean %q: want global or agent", o.Mean)
	}
	if o.Std != Global && o.Std != Agent && o.Std != None {
		return fmt.Errorf("std %q: want global, agent or none", o.Std)
	}
	if o.Weighting != Step && o.Weighting != Trajectory {
		return fmt.Errorf("weighting %q: want step or trajectory", o.Weighting)
	}
	if math.IsNaN(o.Eps) || math.IsInf(o.Eps, 0) || o.Eps < MinEps {
		return fmt.Errorf("eps %v: want a finite value ≥ %g", o.Eps, MinEps)
	}
	if math.IsNaN(o.MinStd) || math.IsInf(o.MinStd, 0) || o.MinStd < 0 {
		return fmt.Errorf("min_std %v: want a finite value ≥ 0", o.MinStd)
	}
	return nil
}

// String names the combination, e.g. "mean=agent std=agent weighting=step eps=1e-06 unbiased min_std=0".
func (o Options) String() string {
	std := "unbiased"
	if !o.Unbiased {
		std = "population"
	}
	return fmt.Sprintf("mean=%s std=%s weighting=%s eps=%g %s min_std=%g", o.Mean, o.Std, o.Weighting, o.Eps, std, o.MinStd)
}

// usesAgentStats reports whether μ_k or σ_k enters the advantage.
func (o Options) usesAgentStats() bool { return o.Mean == Agent || o.Std == Agent }

// usesTrajectoryAverages reports whether the s in the formula is the trajectory average s̄_τ rather than
// the call's own score. Only the purely global combos do that: global GRPO shares one advantage per
// trajectory (as the reference code does), while every variant with an agent-wise statistic works on
// per-call scores (the paper's Table 3).
func (o Options) usesTrajectoryAverages() bool { return !o.usesAgentStats() }
