package normalize

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// Hand-computed advantages of the estimators beyond GRPO and Dr. MAS: grpo-call, at-grpo,
// role-baseline and per-agent overrides.
func TestEstimatorHandValues(t *testing.T) {
	sdCall := math.Sqrt(0.3) // teamA's six calls {1, 1, 0, 0, 1, 0}: μ = 0.5, SS = 1.5, σ = √(1.5/5)
	sdK := math.Sqrt(1.0 / 3)
	third := 1.0 / 3
	// teamMulti under agent × turn: turn 0 = {1, 0, 0} (t1, t2, t3): μ = ⅓, SS = ⅔, σ = √⅓;
	// turn 1 = {1, −0.5} (t1, t3): μ = 0.25, SS = 1.125, σ = √1.125; turn 2 = {1} (t1): μ = 0, σ = 1.
	sd0, sd1 := math.Sqrt(1.0/3), math.Sqrt(1.125)
	pop0, pop1 := math.Sqrt(2.0/9), math.Sqrt(0.5625)

	tests := []struct {
		name    string
		samples []Sample
		opt     Options
		want    []float64
	}{
		{"grpo-call: per-call scores, μ and σ over the calls", teamA, GRPOCall(), []float64{
			0.5 / (sdCall + eps), 0.5 / (sdCall + eps), -0.5 / (sdCall + eps), -0.5 / (sdCall + eps),
			0.5 / (sdCall + eps), -0.5 / (sdCall + eps)}},
		{"grpo-call population std", teamA, with(GRPOCall(), func(o *Options) { o.Unbiased = false }), []float64{
			0.5 / (0.5 + eps), 0.5 / (0.5 + eps), -0.5 / (0.5 + eps), -0.5 / (0.5 + eps), 0.5 / (0.5 + eps), -0.5 / (0.5 + eps)}},
		{"grpo-call counts every call once", teamMulti, GRPOCall(), func() []float64 {
			// calls {1, 1, 1, 0, 0, −0.5}: μ = 2.5/6, the same statistics as Dr. MAS's step weighting here
			mu := 2.5 / 6
			sd := math.Sqrt((3*(1-mu)*(1-mu) + 2*mu*mu + (0.5+mu)*(0.5+mu)) / 5)
			return []float64{(1 - mu) / (sd + eps), (1 - mu) / (sd + eps), (1 - mu) / (sd + eps),
				-mu / (sd + eps), -mu / (sd + eps), (-0.5 - mu) / (sd + eps)}
		}()},
		{"grpo-call one call: μ 0, σ 1", []Sample{s("u", "t", "a", 0.7)}, GRPOCall(), []float64{0.7 / (1 + eps)}},
		{"grpo-call constant group", []Sample{s("u", "t1", "a", 0.1), s("u", "t1", "b", 0.1), s("u", "t2", "a", 0.1)},
			GRPOCall(), []float64{0, 0, 0}},
		{"at-grpo: each turn its own group", teamMulti, ATGRPO(), []float64{
			(2 * third) / (sd0 + eps), 0.75 / (sd1 + eps), 1 / (1 + eps),
			-third / (sd0 + eps), -third / (sd0 + eps), -0.75 / (sd1 + eps)}},
		{"at-grpo population std", teamMulti, with(ATGRPO(), func(o *Options) { o.Unbiased = false }), []float64{
			(2 * third) / (pop0 + eps), 0.75 / (pop1 + eps), 1 / (1 + eps),
			-third / (pop0 + eps), -third / (pop0 + eps), -0.75 / (pop1 + eps)}},
		{"at-grpo min_std floors every turn, the one-call σ = 1 too", teamMulti, with(ATGRPO(), func(o *Options) { o.MinStd = 2 }), []float64{
			(2 * third) / (2 + eps), 0.75 / (2 + eps), 1 / (2 + eps),
			-third / (2 + eps), -third / (2 + eps), -0.75 / (2 + eps)}},
		{"at-grpo with one call per trajectory is drmas", teamA, ATGRPO(), []float64{
			third / (sdK + eps), 2 * third / (sdK + eps), -2 * third / (sdK + eps), -third / (sdK + eps),
			third / (sdK + eps), -third / (sdK + eps)}},
		{"at-grpo turns follow input order, trajectories interleaved", []Sample{
			s("u", "t1", "a", 1), s("u", "t2", "a", 0), s("u", "t1", "a", 0.5), s("u", "t2", "a", 0.5),
		}, ATGRPO(), []float64{0.5 / (math.Sqrt(0.5) + eps), -0.5 / (math.Sqrt(0.5) + eps), 0, 0}}, // turn 1 constant
		{"at-grpo turn reached by one trajectory", []Sample{
			s("u", "t1", "a", 1), s("u", "t1", "a", 1), s("u", "t2", "a", 0),
		}, ATGRPO(), []float64{0.5 / (math.Sqrt(0.5) + eps), 1 / (1 + eps), -0.5 / (math.Sqrt(0.5) + eps)}},
		{"at-grpo trajectory weighting changes nothing", teamMulti,
			with(ATGRPO(), func(o *Options) { o.Weighting = Trajectory }), []float64{
				(2 * third) / (sd0 + eps), 0.75 / (sd1 + eps), 1 / (1 + eps),
				-third / (sd0 + eps), -third / (sd0 + eps), -0.75 / (sd1 + eps)}},
		{"role-baseline: s − μ_k, no scale", teamA, RoleBaseline(), []float64{
			third, 2 * third, -2 * third, -third, third, -third}},
		{"role-baseline one call: μ 0", []Sample{s("u", "t", "a", 0.8), s("u", "t", "b", 0.2)}, RoleBaseline(), []float64{0.8, 0.2}},
		{"role-baseline several calls", teamMulti, RoleBaseline(), []float64{
			1 - 2.5/6, 1 - 2.5/6, 1 - 2.5/6, -2.5 / 6, -2.5 / 6, -0.5 - 2.5/6}},
		{"override: a on Dr. MAS, b on GRPO", teamA,
			with(DrMAS(), func(o *Options) { o.Agents = map[string]Options{"b": GRPO()} }), []float64{
				third / (sdK + eps), 0.5 / (0.5 + eps), -2 * third / (sdK + eps), -0.5 / (0.5 + eps), third / (sdK + eps), 0}},
		{"override: a on GRPO, b on Dr. MAS", teamA,
			with(GRPO(), func(o *Options) { o.Agents = map[string]Options{"b": DrMAS()} }), []float64{
				0.5 / (0.5 + eps), 2 * third / (sdK + eps), -0.5 / (0.5 + eps), -third / (sdK + eps), 0, -third / (sdK + eps)}},
		{"override with its own ε and grpo-call", teamA,
			with(DrMAS(), func(o *Options) {
				o.Agents = map[string]Options{"a": with(GRPOCall(), func(o *Options) { o.Eps = 0.5 })}
			}),
			[]float64{0.5 / (sdCall + 0.5), 2 * third / (sdK + eps), -0.5 / (sdCall + 0.5), -third / (sdK + eps),
				0.5 / (sdCall + 0.5), -third / (sdK + eps)}},
		{"override for an agent never called", teamA,
			with(DrMAS(), func(o *Options) { o.Agents = map[string]Options{"z": GRPO()} }), []float64{
				third / (sdK + eps), 2 * third / (sdK + eps), -2 * third / (sdK + eps), -third / (sdK + eps),
				third / (sdK + eps), -third / (sdK + eps)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Compute(tt.samples, tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			assertAdvantages(t, res.Advantages, tt.want)
		})
	}
}

func TestTurnIndex(t *testing.T) {
	traj := []int32{0, 1, 0, 0, 2, 1}
	turn := make([]int32, len(traj))
	count := make([]int32, 3)
	if n := turnIndex(traj, turn, count); n != 3 {
		t.Errorf("turns %d, want 3", n)
	}
	want := []int32{0, 0, 1, 2, 0, 1}
	for i := range want {
		if turn[i] != want[i] {
			t.Fatalf("turns %v, want %v", turn, want)
		}
	}
	for _, c := range count {
		if c != 0 {
			t.Fatalf("count scratch not cleared: %v", count)
		}
	}
}

// Under agent-turn grouping the per-group statistics have one entry per (agent, turn), in order, and
// the normalization groups are counted per turn.
func TestAgentTurnStats(t *testing.T) {
	res, err := Compute(append(teamMulti[:len(teamMulti):len(teamMulti)], s("u", "t2", "b", 0)), ATGRPO())
	if err != nil {
		t.Fatal(err)
	}
	g := res.Stats.PerGroup[0]
	type entry struct {
		agent string
		turn  int
		calls int
	}
	var got []entry
	for _, a := range g.Agents {
		got = append(got, entry{a.Agent, a.Turn, a.Calls})
	}
	want := []entry{{"a", 0, 3}, {"a", 1, 2}, {"a", 2, 1}, {"b", 0, 1}}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
	if st := res.Stats; st.NormGroups != 4 || st.SingletonGroups != 2 {
		t.Errorf("norm groups %d (one-sample %d), want 4 (2)", st.NormGroups, st.SingletonGroups)
	}
	if !close(g.Agents[1].Mean, 0.25) || !close(g.Agents[1].Std, math.Sqrt(1.125)) {
		t.Errorf("turn 1 statistics %g, %g; want 0.25, √1.125", g.Agents[1].Mean, g.Agents[1].Std)
	}
	// Under Dr. MAS the entries carry no turn, and the JSON has no "turn" key.
	res, err = Compute(teamMulti, DrMAS())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res.Stats.PerGroup[0].Agents[0])
	if strings.Contains(string(b), "turn") {
		t.Errorf("drmas group entry %s has a turn", b)
	}
}

// Energy is ΣA² per agent.
func TestEnergy(t *testing.T) {
	res, err := Compute(teamA, GRPO())
	if err != nil {
		t.Fatal(err)
	}
	a := 0.5 / (0.5 + eps)
	for _, st := range res.Stats.Agents {
		if !close(st.Energy, 2*a*a) {
			t.Errorf("agent %s energy %g, want %g", st.Agent, st.Energy, 2*a*a)
		}
	}
}

func TestOptionsRejects(t *testing.T) {
	tests := []struct {
		name string
		opt  Options
		want string
	}{
		{"bad group", with(DrMAS(), func(o *Options) { o.Group = "turn" }), `group "turn"`},
		{"bad global", with(DrMAS(), func(o *Options) { o.Global = "agent" }), `global "agent"`},
		{"bad override", with(DrMAS(), func(o *Options) { o.Agents = map[string]Options{"s": with(GRPO(), func(o *Options) { o.Eps = 0 })} }),
			"agents.s: eps 0"},
		{"nested override", with(DrMAS(), func(o *Options) {
			o.Agents = map[string]Options{"s": with(GRPO(), func(o *Options) { o.Agents = map[string]Options{"v": GRPO()} })}
		}), "agents.s: an override has no agents of its own"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opt.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// The comparison table: each agent's energy relative to Dr. MAS, on the hand-computed teamA.
func TestCompare(t *testing.T) {
	var est []Estimator
	for _, name := range Presets() {
		o, _ := Preset(name)
		est = append(est, Estimator{name, o})
	}
	c, err := Compare(teamA, est, "drmas")
	if err != nil {
		t.Fatal(err)
	}
	if c.Base != "drmas" || len(c.Estimators) != len(Presets()) || c.Samples != 6 || c.Groups != 1 || c.Trajectories != 3 {
		t.Fatalf("comparison %+v", c)
	}
	sdK := math.Sqrt(1.0 / 3)
	drmas := (1.0/9 + 4.0/9 + 1.0/9) / ((sdK + eps) * (sdK + eps)) // agent a: {⅓, −⅔, ⅓}/(σ_k + ε)
	grpo := 2 * (0.5 / (0.5 + eps)) * (0.5 / (0.5 + eps))
	byName := map[string]EstimatorSummary{}
	for _, e := range c.Estimators {
		byName[e.Name] = e
	}
	a := byName["grpo"].Agents[0]
	if a.Agent != "a" || !close(a.Energy, grpo) || !close(a.EnergyRatio, grpo/drmas) {
		t.Errorf("grpo agent a: %+v; want energy %g, ratio %g", a, grpo, grpo/drmas)
	}
	if r := byName["drmas"].Agents[1].EnergyRatio; r != 1 {
		t.Errorf("drmas ratio to itself %g", r)
	}
	var b strings.Builder
	if err := c.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"energy/drmas", "at-grpo", "role-baseline", "grpo-call", "samples 6, groups 1, trajectories 3"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	// A constant group gives Dr. MAS zero energy: the ratio is undefined, null in JSON.
	c, err = Compare([]Sample{s("u", "t1", "a", 1), s("u", "t2", "a", 1)}, est[:3], "drmas")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(c)
	if !strings.Contains(string(js), `"energy_ratio":null`) {
		t.Errorf("zero base energy: %s", js)
	}
	if _, err := Compare(teamA, []Estimator{{"bad", Options{}}}, ""); err == nil || !strings.Contains(err.Error(), "estimator bad") {
		t.Errorf("invalid estimator: %v", err)
	}
}

func TestEnergyRatios(t *testing.T) {
	r, err := EnergyRatios(teamA, DrMAS())
	if err != nil {
		t.Fatal(err)
	}
	sdK := math.Sqrt(1.0 / 3)
	drmas := (6.0 / 9) / ((sdK + eps) * (sdK + eps))
	grpo := 2 * (0.5 / (0.5 + eps)) * (0.5 / (0.5 + eps))
	for _, a := range []string{"a", "b"} {
		if !close(r[a], grpo/drmas) {
			t.Errorf("agent %s ratio %g, want %g", a, r[a], grpo/drmas)
		}
	}
}

func TestParseEstimator(t *testing.T) {
	base := with(DrMAS(), func(o *Options) { o.Eps, o.Unbiased, o.MinStd = 0.01, false, 0.1 })
	e, err := ParseEstimator("drmas+searcher=grpo+verifier=at-grpo", base)
	if err != nil {
		t.Fatal(err)
	}
	want := with(DrMAS(), func(o *Options) { o.Eps, o.Unbiased, o.MinStd = 0.01, false, 0.1 })
	want.Agents = map[string]Options{
		"searcher": with(GRPO(), func(o *Options) { o.Eps, o.Unbiased, o.MinStd = 0.01, false, 0.1 }),
		"verifier": with(ATGRPO(), func(o *Options) { o.Eps, o.Unbiased, o.MinStd = 0.01, false, 0.1 }),
	}
	if e.Name != "drmas+searcher=grpo+verifier=at-grpo" || e.Options.String() != want.String() {
		t.Errorf("got %s: %s\nwant %s", e.Name, e.Options, want)
	}
	for spec, msg := range map[string]string{
		"ppo":               `estimator "ppo": normalization preset "ppo"`,
		"drmas+searcher":    `"searcher": want agent=preset`,
		"drmas+=grpo":       "empty agent name",
		"grpo+searcher=ppo": `agent searcher: normalization preset "ppo"`,
	} {
		if _, err := ParseEstimator(spec, base); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: error %v, want %q", spec, err, msg)
		}
	}
}
