package normalize

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// Check is the one validation of a spec: a spec it passes resolves into valid options, and a spec it
// rejects does not resolve, with Check's first problem as the error.
func TestSpecCheckIsTheValidation(t *testing.T) {
	names := func(valid ...string) []string { return append([]string{"", "bogus"}, valid...) }
	r := rand.New(rand.NewPCG(7, 8))
	pick := func(xs []string) string { return xs[r.IntN(len(xs))] }
	for range 3000 {
		s := Spec{
			Preset: pick(names(Presets()...)), Mean: pick(names(Global, Agent)), Std: pick(names(Global, Agent, None)),
			Weighting: pick(names(Step, Trajectory)), Group: pick(names(ByAgent, ByAgentTurn)),
			Global: pick(names(OverTrajectories, OverCalls)),
			Eps:    []float64{DefaultEps, 0, MinEps, math.NaN(), math.Inf(1), 0.5}[r.IntN(6)],
			MinStd: []float64{0, 0.1, -1, math.NaN(), math.Inf(1)}[r.IntN(5)], PopulationStd: r.IntN(2) == 0,
		}
		for range r.IntN(3) {
			s.Agents = append(s.Agents, AgentSpec{Name: pick([]string{"", "searcher", "verifier"}), Preset: pick(names(Presets()...))})
		}
		errs := s.Check()
		o, err := s.Options()
		switch {
		case len(errs) == 0 && err != nil:
			t.Fatalf("%+v: Check passes, Options fails: %v", s, err)
		case len(errs) == 0:
			if verr := o.Validate(); verr != nil {
				t.Fatalf("%+v: resolved into invalid options %s: %v", s, o, verr)
			}
		case err == nil || err.Error() != errs[0].Error():
			t.Fatalf("%+v: Check %v, Options error %v", s, errs, err)
		}
	}
}

// Every problem of a spec is reported, each by its key.
func TestSpecCheckReportsEveryField(t *testing.T) {
	s := Spec{Preset: "ppo", Mean: "team", Group: "turn", Eps: 0, MinStd: -1,
		Agents: []AgentSpec{{Name: "searcher", Preset: "x"}, {Preset: "grpo"}}}
	var got []string
	for _, e := range s.Check() {
		got = append(got, e.Field+": "+e.Error())
	}
	want := []string{
		`preset: normalization preset "ppo": want one of grpo, grpo-call, drmas, at-grpo, role-baseline`,
		`mean: mean "team": want global or agent`,
		`group: group "turn": want agent or agent-turn`,
		`eps: eps 0: want a finite number ≥ 1e-50`,
		`min_std: min_std -1: want a finite number ≥ 0`,
		`agents[0].preset: agents[0]: agent searcher: normalization preset "x": want one of grpo, grpo-call, drmas, at-grpo, role-baseline`,
		`agents[1].name: agents[1]: agent override "=grpo": empty agent name`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if errs := (Spec{Eps: DefaultEps, Mean: Agent}).Check(); len(errs) != 1 || errs[0].Field != "" || !strings.HasPrefix(errs[0].Error(), "name a preset (") {
		t.Errorf("no preset, no std: %v", errs)
	}
}

// ComputeResolved gives Compute's advantages and statistics, bit for bit, and the energy ratios
// EnergyRatios gives, as Compare computes them from two separate passes.
func TestComputeResolvedMatchesCompute(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	var opts []Options
	for _, name := range Presets() {
		o, _ := Preset(name)
		opts = append(opts, o)
	}
	opts = append(opts, allCombos()...)
	opts = append(opts, with(DrMAS(), func(o *Options) { o.Agents = map[string]Options{"searcher": GRPO()} }))
	for iter := range 60 {
		samples := randomBatch(r)
		for _, opt := range opts {
			opt.Eps = []float64{DefaultEps, 1e-3}[iter%2]
			if iter%3 == 1 {
				opt.MinStd = 0.05
			}
			for name, a := range opt.Agents {
				a.Eps, a.MinStd = opt.Eps, opt.MinStd
				opt.Agents[name] = a
			}
			want, err := Compute(samples, opt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ComputeResolved(samples, opt)
			if err != nil {
				t.Fatal(err)
			}
			ratios := got.EnergyRatios
			got.EnergyRatios, got.Diagnostics = nil, nil             // both ComputeResolved's alone
			if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) { // %#v tells NaNs and every bit of a float
				t.Fatalf("iter %d %s: ComputeResolved differs from Compute", iter, opt)
			}
			grpo, drmas := references(opt)
			c, err := Compare(samples, []Estimator{{"grpo", grpo}, {"drmas", drmas}}, "drmas")
			if err != nil {
				t.Fatal(err)
			}
			if len(ratios) != len(c.Estimators[0].Agents) {
				t.Fatalf("iter %d %s: %d ratios, want %d", iter, opt, len(ratios), len(c.Estimators[0].Agents))
			}
			for _, a := range c.Estimators[0].Agents {
				if g := ratios[a.Agent]; math.Float64bits(g) != math.Float64bits(a.EnergyRatio) && !(math.IsNaN(g) && math.IsNaN(a.EnergyRatio)) {
					t.Fatalf("iter %d %s: agent %s: ratio %v, want %v", iter, opt, a.Agent, g, a.EnergyRatio)
				}
			}
			if alone, err := EnergyRatios(samples, opt); err != nil || fmt.Sprint(alone) != fmt.Sprint(ratios) {
				t.Fatalf("iter %d %s: EnergyRatios %v (%v), ComputeResolved %v", iter, opt, alone, err, ratios)
			}
		}
	}
}
