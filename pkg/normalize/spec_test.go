package normalize

import (
	"strings"
	"testing"
)

// A spec resolves as config and drmas advantages write it: the preset, then the fields that are set,
// then ε / std estimator / min_std, which the per-agent overrides take too.
func TestSpecOptions(t *testing.T) {
	o, err := Spec{Preset: "at-grpo", Global: "call", Eps: 1e-3, PopulationStd: true, MinStd: 0.1,
		Agents: []AgentSpec{{Name: "searcher", Preset: "grpo"}}}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if o.Group != ByAgentTurn || o.Global != OverCalls || o.Mean != Agent || o.Eps != 1e-3 || o.Unbiased || o.MinStd != 0.1 {
		t.Errorf("options %s", o)
	}
	s := o.Agents["searcher"]
	if len(o.Agents) != 1 || s.Mean != Global || s.Global != OverTrajectories || s.Eps != 1e-3 || s.Unbiased || s.MinStd != 0.1 {
		t.Errorf("override %s", s)
	}
	// No preset: Dr. MAS's other fields under the explicit mean and std.
	o, err = Spec{Mean: Global, Std: None, Eps: DefaultEps}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if want := with(DrMAS(), func(o *Options) { o.Mean, o.Std = Global, None }); o.String() != want.String() {
		t.Errorf("no preset: %s, want %s", o, want)
	}
	for _, c := range []struct {
		spec Spec
		msg  string
	}{
		{Spec{Preset: "drmas", Eps: 1e-6, Agents: []AgentSpec{{Name: "s", Preset: "x"}}}, `agents[0]: agent s: normalization preset "x"`},
		{Spec{Preset: "ppo", Eps: 1e-6}, `normalization preset "ppo"`},
		{Spec{Mean: Agent, Eps: 1e-6}, "name a preset"},
		{Spec{Preset: "drmas", Std: "team", Eps: 1e-6}, `std "team"`},
		{Spec{Preset: "drmas", Eps: 0}, "eps 0"},
	} {
		if _, err := c.spec.Options(); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: error %v, want %q", c.spec, err, c.msg)
		}
	}
}

func TestParseAgentSpecs(t *testing.T) {
	got, err := ParseAgentSpecs([]string{"searcher=grpo", "verifier=at-grpo"})
	if err != nil || len(got) != 2 || got[1] != (AgentSpec{"verifier", "at-grpo"}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := ParseAgentSpecs([]string{"searcher"}); err == nil || !strings.Contains(err.Error(), `"searcher": want agent=preset`) {
		t.Errorf("error %v", err)
	}
}
