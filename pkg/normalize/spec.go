package normalize

import (
	"fmt"
	"strings"
)

// Spec is the estimator as a user writes it, before it is resolved into Options: config's
// algorithm.normalization (a preset name alone, or a map of these fields), drmas advantages' flags and
// drmas estimators' "preset+agent=preset" specs all decode into it, and Options is the one place a
// spec becomes options.
type Spec struct {
	Preset    string `mapstructure:"preset"`    // a name of Presets(); empty: Dr. MAS, with Mean and Std both set
	Mean      string `mapstructure:"mean"`      // global | agent; empty: the preset's
	Std       string `mapstructure:"std"`       // global | agent | none; empty: the preset's
	Weighting string `mapstructure:"weighting"` // step | trajectory; empty: the preset's
	Group     string `mapstructure:"group"`     // agent | agent-turn; empty: the preset's
	Global    string `mapstructure:"global"`    // trajectory | call; empty: the preset's
	// Eps, PopulationStd and MinStd apply to the spec and to each of its agents' presets.
	Eps           float64 `mapstructure:"eps"`
	PopulationStd bool    `mapstructure:"population_std"`
	MinStd        float64 `mapstructure:"min_std"`
	// Agents puts agents on an estimator of their own.
	Agents []AgentSpec `mapstructure:"agents"`
}

// AgentSpec is one per-agent override: {name: searcher, preset: grpo}.
type AgentSpec struct {
	Name   string `mapstructure:"name"`
	Preset string `mapstructure:"preset"`
}

// Options resolves the spec: the preset, then each field that is set, then ε, the std estimator and
// min_std, then the agents' presets (which take those three). The spec is checked (Check), and its
// first problem is the error; the options of a spec without problems are valid by construction and
// are not validated again (Compute's trainer path, ComputeResolved, relies on it).
func (s Spec) Options() (Options, error) {
	if errs := s.Check(); len(errs) > 0 {
		return Options{}, errs[0]
	}
	o := DrMAS()
	if s.Preset != "" {
		o, _ = Preset(s.Preset) // checked
	}
	for _, f := range []struct {
		to   *string
		from string
	}{{&o.Mean, s.Mean}, {&o.Std, s.Std}, {&o.Weighting, s.Weighting}, {&o.Group, s.Group}, {&o.Global, s.Global}} {
		if f.from != "" {
			*f.to = f.from
		}
	}
	o.Eps, o.Unbiased, o.MinStd = s.Eps, !s.PopulationStd, s.MinStd
	for _, a := range s.Agents {
		o, _ = o.WithAgent(a.Name, a.Preset) // checked: a name and a preset
	}
	return o, nil
}

// ParseAgentSpecs reads per-agent overrides written agent=preset (drmas advantages --agent, and the
// parts after the first "+" of an estimator spec).
func ParseAgentSpecs(parts []string) ([]AgentSpec, error) {
	out := make([]AgentSpec, len(parts))
	for i, p := range parts {
		agent, preset, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want agent=preset", p)
		}
		out[i] = AgentSpec{Name: agent, Preset: preset}
	}
	return out, nil
}
