package config

import (
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/normalize"
)

func TestNormalizationEstimators(t *testing.T) {
	cfg, err := Load(write(t, minimal), []string{
		"algorithm.normalization={preset: at-grpo, global: call, min_std: 0.1, agents: [{name: verifier, preset: grpo}]}"})
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.Algorithm.Normalization
	if n.Preset != "at-grpo" || n.Global != "call" || len(n.Agents) != 1 || n.Agents[0] != (normalize.AgentSpec{Name: "verifier", Preset: "grpo"}) {
		t.Errorf("normalization = %+v", n)
	}
	for _, preset := range []string{"grpo-call", "role-baseline"} {
		if _, err := Load(write(t, minimal), []string{"algorithm.normalization=" + preset}); err != nil {
			t.Errorf("preset %s: %v", preset, err)
		}
	}
	for _, c := range []struct{ set, want string }{
		{"algorithm.normalization=ppo", "algorithm.normalization.preset: must be one of grpo, grpo-call, drmas, at-grpo, role-baseline"},
		{"algorithm.normalization={preset: drmas, group: turn}", "algorithm.normalization.group: must be one of agent, agent-turn"},
		{"algorithm.normalization={preset: drmas, global: agent}", "algorithm.normalization.global: must be one of trajectory, call"},
		{"algorithm.normalization={preset: drmas, agents: [{name: searcher, preset: grpo}]}", `algorithm.normalization.agents[0].name: no agent "searcher"`},
		{"algorithm.normalization={preset: drmas, agents: [{name: solver, preset: grpo}, {name: solver, preset: drmas}]}", `agents[1].name: agent "solver" has a second override`},
		{"algorithm.normalization={preset: drmas, agents: [{name: solver, preset: ppo}]}", "algorithm.normalization.agents[0].preset: must be one of"},
		{"algorithm.normalization={preset: drmas, agents: [{preset: grpo}]}", "algorithm.normalization.agents[0].name: required"},
		{`algorithm.normalization={preset: "", mean: agent}`, "algorithm.normalization: name a preset (grpo, grpo-call, drmas, at-grpo, role-baseline) or set both mean and std"},
		{"algorithm.normalization={preset: drmas, std: team}", `algorithm.normalization.std: must be one of global, agent, none (got "team")`},
		{"algorithm.normalization={preset: drmas, eps: 0}", "algorithm.normalization.eps: must be a finite number ≥ 1e-50 (got 0)"},
		{"algorithm.normalization={preset: drmas, min_std: -1}", "algorithm.normalization.min_std: must be a finite number ≥ 0 (got -1)"},
		{"algorithm.normalization={preset: drmas, agents: [{name: solver, preset: grpo, eps: 1}]}", "unknown key algorithm.normalization.agents[0].eps"},
	} {
		_, err := Load(write(t, minimal), []string{c.set})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.set, err, c.want)
		}
	}
}

func TestGuardKeys(t *testing.T) {
	cfg, err := Load(write(t, minimal), []string{"algorithm.guard={window: 20, factor: 4, action: skip}"})
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Algorithm.Guard; g != (algo.Guard{Window: 20, Factor: 4, Action: "skip"}) {
		t.Errorf("guard = %+v", g)
	}
	if g := Defaults().Algorithm.Guard; g.Window != 0 || g.Action != "log" {
		t.Errorf("the guard must be off by default: %+v", g)
	}
	for _, c := range []struct{ set, want string }{
		{"algorithm.guard.window=2", "algorithm.guard.window: must be in [3, 65536]"},
		{"algorithm.guard.window=-1", "algorithm.guard.window: must be in [3, 65536]"},
		{"algorithm.guard.factor=1", "algorithm.guard.factor: must be a finite number > 1"},
		{"algorithm.guard.action=drop", "algorithm.guard.action: must be one of log, clip, skip"},
		{"algorithm.guard.windows=3", "unknown key algorithm.guard.windows"},
	} {
		_, err := Load(write(t, minimal), []string{c.set})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.set, err, c.want)
		}
	}
}
