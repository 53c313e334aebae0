package config

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/train/algo"
)

// checkNormalization checks algorithm.normalization: the estimator and its per-agent overrides.
func (c *Config) checkNormalization(ck *checker) {
	n := c.Algorithm.Normalization
	const key = "algorithm.normalization"
	if n.Preset != "" {
		ck.oneOf(key+".preset", n.Preset, normalize.Presets())
	}
	if n.Preset == "" && (n.Mean == "" || n.Std == "") {
		ck.bad(key, "name a preset (%s) or set both mean and std", strings.Join(normalize.Presets(), ", "))
	}
	for _, f := range []struct {
		key, v  string
		allowed []string
	}{
		{"mean", n.Mean, Means}, {"std", n.Std, Stds}, {"weighting", n.Weighting, Weightings},
		{"group", n.Group, Groups}, {"global", n.Global, GlobalOver},
	} {
		if f.v != "" {
			ck.oneOf(key+"."+f.key, f.v, f.allowed)
		}
	}
	if !(n.Eps >= normalize.MinEps) || math.IsInf(n.Eps, 0) {
		ck.bad(key+".eps", "must be a finite number ≥ %g (got %g)", normalize.MinEps, n.Eps)
	}
	ck.nonNeg(key+".min_std", n.MinStd)
	seen := map[string]bool{}
	for i, a := range n.Agents {
		k := fmt.Sprintf("%s.agents[%d]", key, i)
		switch {
		case a.Name == "":
			ck.bad(k+".name", "required (an agent of the agents section)")
		case !slices.ContainsFunc(c.Agents, func(x AgentConfig) bool { return x.Name == a.Name }):
			ck.bad(k+".name", "no agent %q in the agents section", a.Name)
		case seen[a.Name]:
			ck.bad(k+".name", "agent %q has a second override", a.Name)
		}
		seen[a.Name] = true
		ck.oneOf(k+".preset", a.Preset, normalize.Presets())
	}
}

// checkGuard checks algorithm.guard, the online per-agent gradient guard.
func (c *Config) checkGuard(ck *checker) {
	g := c.Algorithm.Guard
	if g.Window != 0 {
		ck.intIn("algorithm.guard.window", g.Window, 3, 1<<16)
	}
	if !(g.Factor > 1) || math.IsInf(g.Factor, 0) {
		ck.bad("algorithm.guard.factor", "must be a finite number > 1 (got %g)", g.Factor)
	}
	ck.registered("algorithm.guard.action", g.Action, algo.GuardActions)
}
