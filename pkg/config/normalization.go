package config

import (
	"fmt"
	"math"
	"slices"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/choice"
)

// checkNormalization checks algorithm.normalization: the spec checks its own fields (normalize's
// rules, the ones drmas advantages applies), reported here by key; what only the config knows, that
// each override names an agent of the agents section once, is checked here.
func (c *Config) checkNormalization(ck *choice.Problems) {
	n := c.Algorithm.Normalization
	const key = "algorithm.normalization"
	for _, e := range n.Check() {
		k := key
		if e.Field != "" {
			k += "." + e.Field
		}
		switch v, _ := e.Value.(string); {
		case e.Field == "":
			ck.Bad(k, "%s", e.Want)
		case e.Allowed != nil:
			ck.OneOf(k, v, e.Allowed)
		case e.Value == "":
			ck.Bad(k, "required (%s of the agents section)", e.Want)
		default:
			ck.Bad(k, "must be %s (got %v)", e.Want, e.Value)
		}
	}
	seen := map[string]bool{}
	for i, a := range n.Agents {
		k := fmt.Sprintf("%s.agents[%d].name", key, i)
		switch {
		case a.Name == "": // the spec's check reports it
		case !slices.ContainsFunc(c.Agents, func(x AgentConfig) bool { return x.Name == a.Name }):
			ck.Bad(k, "no agent %q in the agents section", a.Name)
		case seen[a.Name]:
			ck.Bad(k, "agent %q has a second override", a.Name)
		}
		seen[a.Name] = true
	}
}

// checkGuard checks algorithm.guard, the online per-agent gradient guard.
func (c *Config) checkGuard(ck *choice.Problems) {
	g := c.Algorithm.Guard
	if g.Window != 0 {
		ck.IntIn("algorithm.guard.window", g.Window, 3, 1<<16)
	}
	if !(g.Factor > 1) || math.IsInf(g.Factor, 0) {
		ck.Bad("algorithm.guard.factor", "must be a finite number > 1 (got %g)", g.Factor)
	}
	ck.Registered("algorithm.guard.action", g.Action, algo.GuardActions)
}

// checkCorrection checks algorithm.rollout_correction, the off-policy correction.
func (c *Config) checkCorrection(ck *choice.Problems) {
	rc := c.Algorithm.RolloutCorrection
	ck.Registered("algorithm.rollout_correction.mode", rc.Mode, algo.RolloutCorrections)
	if !(rc.Threshold > 1) || math.IsInf(rc.Threshold, 0) {
		ck.Bad("algorithm.rollout_correction.threshold", "must be a finite number > 1 (got %g)", rc.Threshold)
	}
}
