package env

import (
	"slices"
	"strings"
	"testing"

	"github.com/go-viper/mapstructure/v2"
)

func TestOrchestraValidate(t *testing.T) {
	valid := []OrchestraConfig{toyConfig("math"), toyConfig("search"), mathFlow(), searchFlow()}
	for i, c := range valid {
		if err := c.Validate(); err != nil {
			t.Errorf("valid config %d: %v", i, err)
		}
	}
	cases := []struct {
		mut  func(c *OrchestraConfig)
		want string
	}{
		{func(c *OrchestraConfig) { c.Type = "" }, "orchestra.type: required"},
		{func(c *OrchestraConfig) { c.Type = "chain" }, `orchestra.type: unknown orchestra "chain"`},
		{func(c *OrchestraConfig) { c.MaxTurns = 0 }, "orchestra.max_turns: must be ≥ 1"},
		{func(c *OrchestraConfig) { c.MaxLoopNum = -1 }, "orchestra.max_loop_num: must be ≥ 1"},
		{func(c *OrchestraConfig) { c.TopK = 0 }, "orchestra.topk: must be ≥ 1"},
		{func(c *OrchestraConfig) { c.InvalidActionPenalty = ptr(-0.1) }, "orchestra.invalid_action_penalty: must be ≥ 0"},
		{func(c *OrchestraConfig) { c.Prompts = "short" }, "orchestra.prompts: must be"},
		{func(c *OrchestraConfig) { c.Curriculum.Inject = Ramp{P0: 1.5, Hold: 1} }, "orchestra.curriculum.inject.p0: must be in [0, 1]"},
		{func(c *OrchestraConfig) { c.Curriculum.ForceSearch = Ramp{P0: 0.5} }, "orchestra.curriculum.force_search: p0 > 0 needs hold or decay"},
		{func(c *OrchestraConfig) { c.Curriculum.ForceSearch = Ramp{P0: 0.5, Decay: -2} }, "orchestra.curriculum.force_search.decay: must be ≥ 0"},
		{func(c *OrchestraConfig) { c.Type = "math"; c.Curriculum.Inject = Ramp{P0: 1, Hold: 1} }, "orchestra.curriculum: only the search orchestra"},
	}
	for _, tc := range cases {
		c := toyConfig("search")
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
}

func TestFlowValidate(t *testing.T) {
	cases := []struct {
		mut  func(f *FlowConfig)
		want string
	}{
		{func(f *FlowConfig) { f.Steps = nil }, "orchestra.flow.steps: a flow needs at least one step"},
		{func(f *FlowConfig) { f.Steps[1].Agent = "solver" }, `orchestra.flow.steps[1].agent: "solver" has two steps`},
		{func(f *FlowConfig) { f.Steps[0].Next = "critic" }, `orchestra.flow.steps[0].next: "critic" is neither`},
		{func(f *FlowConfig) { f.Steps[0].Last = "x" }, "orchestra.flow.steps[0].last"},
		{func(f *FlowConfig) { f.Steps[1].Routes[1].Next = "nobody" }, "orchestra.flow.steps[1].routes[1].next"},
		{func(f *FlowConfig) { f.Steps[1].Routes[0].When = " " }, "orchestra.flow.steps[1].routes[0].when: required"},
		{func(f *FlowConfig) { f.Steps[1].Tag = "" }, "orchestra.flow.steps[1].tag: routes and tools need a tag"},
		{func(f *FlowConfig) { f.Steps[1].Tag = "ver ify" }, "orchestra.flow.steps[1].tag"},
		{func(f *FlowConfig) { f.Steps[0].Tool = "calculator" }, `orchestra.flow.steps[0].tool: unknown tool "calculator"`},
		{func(f *FlowConfig) { f.Steps[0].MaxCalls = -1 }, "orchestra.flow.steps[0].max_calls"},
		{func(f *FlowConfig) { f.Start = "boss" }, "orchestra.flow.start"},
		{func(f *FlowConfig) { f.MaxCalls = 0 }, "orchestra.flow.max_calls: must be ≥ 1"},
		{func(f *FlowConfig) { f.Answer = "answer" }, `orchestra.flow.answer: no step parses the answer tag "answer"`},
		{func(f *FlowConfig) { f.Match = "fuzzy" }, "orchestra.flow.match"},
	}
	for _, tc := range cases {
		c := mathFlow()
		tc.mut(&c.Flow)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	// A search tool needs a retriever.
	if _, err := NewOrchestra(searchFlow(), agentsNamed("m", "verifier", "searcher", "answerer"), nil); err == nil ||
		!strings.Contains(err.Error(), "orchestra.flow.steps[1].tool: search needs a retriever") {
		t.Errorf("err = %v", err)
	}
}

func TestPenaltyDefaults(t *testing.T) {
	for typ, want := range map[string]float64{"math": 0.1, "search": 0.01, "flow": 0.1} {
		if got := toyConfig(typ).Penalty(); got != want {
			t.Errorf("%s: penalty %g, want %g", typ, got, want)
		}
	}
	c := toyConfig("math")
	c.InvalidActionPenalty = ptr(0.0)
	if c.Penalty() != 0 {
		t.Error("an explicit 0 penalty was replaced by the default")
	}
}

func TestRamp(t *testing.T) {
	r := Ramp{P0: 0.8, Hold: 10, Decay: 20}
	for it, want := range map[int]float64{0: 0.8, 10: 0.8, 20: 0.4, 25: 0.2, 30: 0, 100: 0} {
		if got := r.At(it); !approx(got, want) {
			t.Errorf("At(%d) = %g, want %g", it, got, want)
		}
	}
	s := CurriculumConfig{Inject: r, ForceSearch: Ramp{P0: 1, Decay: 4}}.At(2)
	if !approx(s.InjectP, 0.8) || !approx(s.ForceSearchP, 0.5) {
		t.Errorf("schedule %+v", s)
	}
	if m := s.Metrics(); m["curriculum/force_search_p"] != 0.5 || len(m) != 2 {
		t.Errorf("metrics %v", m)
	}
}

func TestValidateAgents(t *testing.T) {
	cases := []struct {
		agents []AgentConfig
		want   string
	}{
		{nil, "agents: at least one agent"},
		{[]AgentConfig{{Name: ""}}, "agents[0].name: required"},
		{[]AgentConfig{{Name: "a"}, {Name: "a"}}, `agents[1].name: "a" already used by agents[0]`},
		{[]AgentConfig{{Name: "a", Sampling: SamplingConfig{Temperature: ptr(-1.0)}}}, "agents[0].sampling.temperature"},
		{[]AgentConfig{{Name: "a"}, {Name: "b", Sampling: SamplingConfig{TopP: 1.5}}}, "agents[1].sampling.top_p"},
		{[]AgentConfig{{Name: "a", Sampling: SamplingConfig{TopK: -1}}}, "agents[0].sampling.top_k"},
		{[]AgentConfig{{Name: "a", Sampling: SamplingConfig{MaxNewTokens: -3}}}, "agents[0].sampling.max_new_tokens"},
		{[]AgentConfig{{Name: "a", Reward: RewardConfig{RoleWeight: 2}}}, "agents[0].reward.role_weight"},
	}
	for _, tc := range cases {
		if err := ValidateAgents(tc.agents); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	s := SamplingConfig{}.Resolve()
	if s.Temperature != DefaultTemperature || s.MaxNewTokens != DefaultMaxNewTokens {
		t.Errorf("defaults %+v", s)
	}
	if s := (SamplingConfig{Temperature: ptr(0.0), MaxNewTokens: 5, TopK: 3}).Resolve(); s.Temperature != 0 || s.MaxNewTokens != 5 || s.TopK != 3 {
		t.Errorf("explicit values lost: %+v", s)
	}
}

func TestBindAgents(t *testing.T) {
	cases := []struct {
		agents []AgentConfig
		want   string
	}{
		{agentsNamed("m", "solver"), `agents: the math orchestra needs an agent named "verifier"`},
		{agentsNamed("m", "solver", "verifier", "critic"), `agents[2].name: the math orchestra has no role "critic"`},
		{[]AgentConfig{{Name: "solver", Prompt: "{{.Question"}, {Name: "verifier"}}, "agents[0].prompt"},
		{[]AgentConfig{{Name: "solver"}, {Name: "verifier", Prompt: "{{.Answer}}"}}, "agents[1].prompt"},
	}
	for _, tc := range cases {
		if _, err := NewOrchestra(toyConfig("math"), tc.agents, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
}

// TestDecodeStrict decodes YAML-shaped maps the way pkg/config does (mapstructure, unknown keys are
// errors) to pin the key names.
func TestDecodeStrict(t *testing.T) {
	decode := func(in, out any) error {
		d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{ErrorUnused: true, Result: out})
		if err != nil {
			t.Fatal(err)
		}
		return d.Decode(in)
	}
	cfg := DefaultOrchestraConfig()
	in := map[string]any{"type": "search", "max_turns": 3, "topk": 1, "invalid_action_penalty": 0.0, "prompts": "toy",
		"curriculum": map[string]any{"inject": map[string]any{"p0": 1.0, "hold": 5, "decay": 10},
			"force_search": map[string]any{"p0": 0.5, "decay": 7}}}
	if err := decode(in, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Type != "search" || cfg.MaxTurns != 3 || cfg.TopK != 1 || cfg.MaxLoopNum != 2 || cfg.Penalty() != 0 ||
		cfg.Prompts != PromptsToy || cfg.Curriculum.Inject != (Ramp{1, 5, 10}) || cfg.Curriculum.ForceSearch != (Ramp{0.5, 0, 7}) {
		t.Errorf("decoded %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Error(err)
	}
	flow := DefaultOrchestraConfig()
	in = map[string]any{"type": "flow", "flow": map[string]any{"answer": "boxed", "match": "math", "max_calls": 6, "start": "solver",
		"steps": []any{
			map[string]any{"agent": "solver", "tag": "boxed", "max_calls": 2, "next": "verifier", "last": "end", "private": false},
			map[string]any{"agent": "verifier", "tag": "verify", "next": "end", "tool": "",
				"routes": []any{map[string]any{"when": "approve", "next": "end"}, map[string]any{"when": "reject", "next": "solver"}}},
		}}}
	if err := decode(in, &flow); err != nil {
		t.Fatal(err)
	}
	if err := flow.Validate(); err != nil || flow.Flow.MaxCalls != 6 || flow.Flow.Steps[1].Routes[1].Next != "solver" {
		t.Errorf("decoded %+v: %v", flow.Flow, err)
	}
	var agents []AgentConfig
	ain := []any{map[string]any{"name": "solver", "model": "small", "prompt": "P{{.Question}}",
		"sampling": map[string]any{"temperature": 0.0, "top_p": 0.9, "top_k": 5, "max_new_tokens": 8, "stop": []any{"\n"}},
		"reward":   map[string]any{"role_weight": 0.5}}}
	if err := decode(ain, &agents); err != nil {
		t.Fatal(err)
	}
	a := agents[0]
	if a.Name != "solver" || a.Model != "small" || a.Prompt != "P{{.Question}}" || a.Sampling.Temperature == nil ||
		*a.Sampling.Temperature != 0 || a.Sampling.TopP != 0.9 || a.Sampling.TopK != 5 || a.Sampling.MaxNewTokens != 8 ||
		len(a.Sampling.Stop) != 1 || a.Reward.RoleWeight != 0.5 {
		t.Errorf("decoded %+v", a)
	}
	if err := decode(map[string]any{"type": "math", "max_turn": 3}, &cfg); err == nil || !strings.Contains(err.Error(), "max_turn") {
		t.Errorf("an unknown key decoded: %v", err)
	}
}

func TestRoles(t *testing.T) {
	if got := Roles("search"); !slices.Equal(got, []string{"verifier", "searcher", "answerer"}) {
		t.Errorf("search roles %v", got)
	}
	if got := Roles("math"); !slices.Equal(got, []string{"solver", "verifier"}) {
		t.Errorf("math roles %v", got)
	}
	if Roles("flow") != nil || Roles("nope") != nil {
		t.Error("flow and unknown types have no fixed roles")
	}
}
