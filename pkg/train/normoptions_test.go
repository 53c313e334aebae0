package train

import (
	"testing"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/normalize"
)

// The config's estimator reaches normalize: presets, group/global and per-agent overrides that take
// the section's eps, std estimator and min_std.
func TestNormOptions(t *testing.T) {
	o, err := normOptions(config.NormalizationConfig{Preset: "at-grpo", Global: "call", Eps: 1e-3, PopulationStd: true, MinStd: 0.1,
		Agents: []config.AgentNormalization{{Name: "searcher", Preset: "grpo"}}})
	if err != nil {
		t.Fatal(err)
	}
	if o.Group != normalize.ByAgentTurn || o.Global != normalize.OverCalls || o.Eps != 1e-3 || o.Unbiased || o.MinStd != 0.1 {
		t.Errorf("options %s", o)
	}
	s := o.Agents["searcher"]
	if len(o.Agents) != 1 || s.Mean != normalize.Global || s.Global != normalize.OverTrajectories || s.Eps != 1e-3 || s.Unbiased || s.MinStd != 0.1 {
		t.Errorf("override %s", s)
	}
	if _, err := normOptions(config.NormalizationConfig{Preset: "drmas", Eps: 1e-6, Agents: []config.AgentNormalization{{Name: "s", Preset: "x"}}}); err == nil {
		t.Error("a bad override preset must be an error")
	}
}
