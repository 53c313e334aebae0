package normalize

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

const eps = DefaultEps

func s(uid, traj, agent string, score float64) Sample {
	return Sample{UID: uid, TrajUID: traj, Agent: agent, Score: score}
}

func with(o Options, f func(*Options)) Options { f(&o); return o }

func combo(mean, std string) Options {
	return with(DrMAS(), func(o *Options) { o.Mean, o.Std = mean, std })
}

// close reports whether got and want agree to 1e-12, relative to the larger magnitude (absolute near 0).
func close(got, want float64) bool {
	return math.Abs(got-want) <= 1e-12*math.Max(1, math.Max(math.Abs(got), math.Abs(want)))
}

func assertAdvantages(t *testing.T, got, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d advantages, want %d", len(got), len(want))
	}
	for i := range want {
		if !close(got[i], want[i]) {
			t.Errorf("advantage[%d] = %.17g, want %.17g", i, got[i], want[i])
		}
	}
}

// teamA: one uid, three trajectories with agents a and b once each.
// Trajectory averages s̄ = {1, 0, 0.5}: μ = 0.5, unbiased σ = 0.5, population σ = √(1/6).
// Agent a: {1, 0, 1}: μ_a = 2/3; agent b: {1, 0, 0}: μ_b = 1/3; both unbiased σ_k = √(1/3), population √(2/9).
var teamA = []Sample{
	s("u", "t1", "a", 1), s("u", "t1", "b", 1),
	s("u", "t2", "a", 0), s("u", "t2", "b", 0),
	s("u", "t3", "a", 1), s("u", "t3", "b", 0),
}

// teamMulti: agent a called several times per trajectory.
// Calls of a: t1 {1, 1, 1}, t2 {0}, t3 {0, −0.5}.
//
//	step:        μ = 2.5/6, SS = 3(7/12)² + 2(5/12)² + (11/12)² = 2.208333…, σ = √(SS/5)
//	trajectory:  w = {⅓, ⅓, ⅓, 1, ½, ½}, μ = (1 + 0 − 0.25)/3 = 0.25,
//	             SS_w = (0.75)² + (0.25)² + ½(0.25)² + ½(0.75)² = 0.9375, σ = √(0.9375/2)
//	GRPO:        s̄ = {1, 0, −0.25}, μ = 0.25, SS = 0.875, σ = √(0.875/2)
var teamMulti = []Sample{
	s("u", "t1", "a", 1), s("u", "t1", "a", 1), s("u", "t1", "a", 1),
	s("u", "t2", "a", 0),
	s("u", "t3", "a", 0), s("u", "t3", "a", -0.5),
}

func TestComputeHandValues(t *testing.T) {
	sdA, sdK := 0.5, math.Sqrt(1.0/3)
	popA, popK := math.Sqrt(1.0/6), math.Sqrt(2.0/9)
	third := 1.0 / 3
	stepMu := 2.5 / 6
	stepSD := math.Sqrt((3*(7.0/12)*(7.0/12) + 2*(5.0/12)*(5.0/12) + (11.0/12)*(11.0/12)) / 5)
	trajSD := math.Sqrt(0.9375 / 2)
	grpoSD := math.Sqrt(0.875 / 2)

	tests := []struct {
		name    string
		samples []Sample
		opt     Options
		want    []float64
	}{
		{"grpo", teamA, GRPO(), []float64{
			0.5 / (sdA + eps), 0.5 / (sdA + eps), -0.5 / (sdA + eps), -0.5 / (sdA + eps), 0, 0}},
		{"grpo population std", teamA, with(GRPO(), func(o *Options) { o.Unbiased = false }), []float64{
			0.5 / (popA + eps), 0.5 / (popA + eps), -0.5 / (popA + eps), -0.5 / (popA + eps), 0, 0}},
		{"grpo eps 0.5", teamA, with(GRPO(), func(o *Options) { o.Eps = 0.5 }), []float64{
			0.5, 0.5, -0.5, -0.5, 0, 0}},
		{"drmas", teamA, DrMAS(), []float64{
			third / (sdK + eps), 2 * third / (sdK + eps),
			-2 * third / (sdK + eps), -third / (sdK + eps),
			third / (sdK + eps), -third / (sdK + eps)}},
		{"drmas population std", teamA, with(DrMAS(), func(o *Options) { o.Unbiased = false }), []float64{
			third / (popK + eps), 2 * third / (popK + eps),
			-2 * third / (popK + eps), -third / (popK + eps),
			third / (popK + eps), -third / (popK + eps)}},
		{"mean agent std global", teamA, combo(Agent, Global), []float64{
			third / (sdA + eps), 2 * third / (sdA + eps),
			-2 * third / (sdA + eps), -third / (sdA + eps),
			third / (sdA + eps), -third / (sdA + eps)}},
		{"mean global std agent", teamA, combo(Global, Agent), []float64{ // per-call s − μ, μ = 0.5
			0.5 / (sdK + eps), 0.5 / (sdK + eps),
			-0.5 / (sdK + eps), -0.5 / (sdK + eps),
			0.5 / (sdK + eps), -0.5 / (sdK + eps)}},
		{"mean global std none", teamA, combo(Global, None), []float64{0.5, 0.5, -0.5, -0.5, 0, 0}},
		{"mean agent std none", teamA, combo(Agent, None), []float64{
			third, 2 * third, -2 * third, -third, third, -third}},
		{"drmas step, agent called several times", teamMulti, DrMAS(), []float64{
			(1 - stepMu) / (stepSD + eps), (1 - stepMu) / (stepSD + eps), (1 - stepMu) / (stepSD + eps),
			-stepMu / (stepSD + eps), -stepMu / (stepSD + eps), (-0.5 - stepMu) / (stepSD + eps)}},
		{"drmas trajectory weighting", teamMulti, with(DrMAS(), func(o *Options) { o.Weighting = Trajectory }), []float64{
			0.75 / (trajSD + eps), 0.75 / (trajSD + eps), 0.75 / (trajSD + eps),
			-0.25 / (trajSD + eps), -0.25 / (trajSD + eps), -0.75 / (trajSD + eps)}},
		{"trajectory weighting population std", teamMulti,
			with(DrMAS(), func(o *Options) { o.Weighting, o.Unbiased = Trajectory, false }), []float64{
				0.75 / (math.Sqrt(0.3125) + eps), 0.75 / (math.Sqrt(0.3125) + eps), 0.75 / (math.Sqrt(0.3125) + eps),
				-0.25 / (math.Sqrt(0.3125) + eps), -0.25 / (math.Sqrt(0.3125) + eps), -0.75 / (math.Sqrt(0.3125) + eps)}},
		{"grpo, several calls per trajectory", teamMulti, GRPO(), []float64{
			0.75 / (grpoSD + eps), 0.75 / (grpoSD + eps), 0.75 / (grpoSD + eps),
			-0.25 / (grpoSD + eps), -0.5 / (grpoSD + eps), -0.5 / (grpoSD + eps)}},
		{"grpo ignores weighting", teamMulti, with(GRPO(), func(o *Options) { o.Weighting = Trajectory }), []float64{
			0.75 / (grpoSD + eps), 0.75 / (grpoSD + eps), 0.75 / (grpoSD + eps),
			-0.25 / (grpoSD + eps), -0.5 / (grpoSD + eps), -0.5 / (grpoSD + eps)}},
		{"one trajectory: grpo gives μ 0, σ 1", []Sample{s("u", "t", "a", 0.8), s("u", "t", "b", 0.6)}, GRPO(),
			[]float64{0.7 / (1 + eps), 0.7 / (1 + eps)}},
		{"one call per agent: drmas gives μ 0, σ 1", []Sample{s("u", "t", "a", 0.8), s("u", "t", "b", -0.1)}, DrMAS(),
			[]float64{0.8 / (1 + eps), -0.1 / (1 + eps)}},
		{"one trajectory under trajectory weighting", []Sample{s("u", "t", "a", 1), s("u", "t", "a", 0)},
			with(DrMAS(), func(o *Options) { o.Weighting = Trajectory }), []float64{1 / (1 + eps), 0}},
		{"one-sample rule, no std", []Sample{s("u", "t", "a", 0.8)}, combo(Agent, None), []float64{0.8}},
		{"mixed combo mixes one-sample stats", []Sample{s("u", "t1", "a", 1), s("u", "t2", "a", 0), s("u", "t2", "b", 0)},
			combo(Agent, Global), // μ_a = 0.5; μ_b = 0 (one call); s̄ = {1, 0}: σ = √0.5
			[]float64{0.5 / (math.Sqrt(0.5) + eps), -0.5 / (math.Sqrt(0.5) + eps), 0}},
		{"agent absent from a group", []Sample{
			s("u1", "t1", "a", 1), s("u1", "t1", "b", 1), s("u1", "t2", "a", 0), s("u1", "t2", "b", 0),
			s("u2", "t1", "a", 1), s("u2", "t2", "a", 0), s("u2", "t3", "a", 0.5),
		}, DrMAS(), []float64{
			0.5 / (math.Sqrt(0.5) + eps), 0.5 / (math.Sqrt(0.5) + eps), -0.5 / (math.Sqrt(0.5) + eps), -0.5 / (math.Sqrt(0.5) + eps),
			0.5 / (0.5 + eps), -0.5 / (0.5 + eps), 0}},
		{"trajectories are scoped by uid", []Sample{
			s("u1", "t", "a", 1), s("u1", "x", "a", 0), s("u2", "t", "a", 0), s("u2", "y", "a", 0),
		}, GRPO(), []float64{0.5 / (math.Sqrt(0.5) + eps), -0.5 / (math.Sqrt(0.5) + eps), 0, 0}},
		{"interleaved groups", []Sample{
			s("u1", "t1", "a", 1), s("u2", "t1", "a", 0.5), s("u1", "t2", "a", 0), s("u2", "t2", "a", 0.5),
		}, DrMAS(), []float64{0.5 / (math.Sqrt(0.5) + eps), 0, -0.5 / (math.Sqrt(0.5) + eps), 0}},
		{"min_std floors a penalty-only group", []Sample{
			s("u", "t1", "s", 0), s("u", "t1", "v", 0), s("u", "t2", "s", -0.01), s("u", "t2", "v", 0),
		}, with(DrMAS(), func(o *Options) { o.MinStd = 0.1 }), []float64{0.005 / (0.1 + eps), 0, -0.005 / (0.1 + eps), 0}},
		{"no floor: the spike", []Sample{
			s("u", "t1", "s", 0), s("u", "t1", "v", 0), s("u", "t2", "s", -0.01), s("u", "t2", "v", 0),
		}, DrMAS(), []float64{0.005 / (math.Sqrt(0.00005) + eps), 0, -0.005 / (math.Sqrt(0.00005) + eps), 0}},
		{"mixed combo with σ = 0 divides by ε", []Sample{
			s("u", "t1", "a", 1), s("u", "t1", "b", 0), s("u", "t2", "a", 0), s("u", "t2", "b", 1),
		}, combo(Agent, Global), []float64{0.5 / eps, -0.5 / eps, -0.5 / eps, 0.5 / eps}},
		{"empty input", nil, DrMAS(), []float64{}},
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

// A constant group must give exactly 0 even where Σx/n misses x: (0.1+0.1+0.1)/3 ≠ 0.1 in float64.
func TestConstantGroupsAreExactlyZero(t *testing.T) {
	x := 0.1 // a variable: constant expressions are exact in Go
	if (x+x+x)/3 == x {
		t.Fatal("test premise: float64 rounding should make the naive mean differ")
	}
	samples := []Sample{
		s("u", "t1", "a", 0.1), s("u", "t1", "a", 0.1), s("u", "t1", "a", 0.1),
		s("u", "t2", "a", 0.1),
		s("v", "t1", "a", 0.1), s("v", "t1", "b", 0.1), s("v", "t2", "a", 0.1), s("v", "t2", "b", 0.1), s("v", "t2", "b", 0.1),
	}
	for _, opt := range allCombos() {
		t.Run(opt.String(), func(t *testing.T) {
			res, err := Compute(samples, opt)
			if err != nil {
				t.Fatal(err)
			}
			for i, a := range res.Advantages {
				if a != 0 {
					t.Errorf("advantage[%d] = %g, want exactly 0", i, a)
				}
			}
			st := res.Stats
			if st.FracZeroStd != 1 || st.ZeroStdGroups != st.NormGroups {
				t.Errorf("frac_zero_std %g (%d of %d groups), want 1", st.FracZeroStd, st.ZeroStdGroups, st.NormGroups)
			}
		})
	}
}

func allCombos() []Options {
	var out []Options
	for _, mean := range []string{Global, Agent} {
		for _, std := range []string{Global, Agent, None} {
			for _, w := range []string{Step, Trajectory} {
				for _, unbiased := range []bool{true, false} {
					out = append(out, with(DrMAS(), func(o *Options) { o.Mean, o.Std, o.Weighting, o.Unbiased = mean, std, w, unbiased }))
				}
			}
		}
	}
	return out
}

// searchTeam is testdata/samples.jsonl: q1 has team rewards {1, 0, 0}, q2 all 0 with one malformed
// search call (−0.01), the penalty-only case.
func searchTeam() []Sample {
	var out []Sample
	add := func(uid, traj string, calls ...any) {
		for i := 0; i < len(calls); i += 2 {
			out = append(out, s(uid, traj, calls[i].(string), calls[i+1].(float64)))
		}
	}
	add("q1", "q1-0", "verifier", 1.0, "searcher", 1.0, "verifier", 1.0, "answerer", 1.0)
	add("q1", "q1-1", "verifier", 0.0, "answerer", 0.0)
	add("q1", "q1-2", "verifier", 0.0, "searcher", -0.01, "verifier", 0.0, "answerer", 0.0)
	add("q2", "q2-0", "verifier", 0.0, "searcher", 0.0, "verifier", 0.0, "answerer", 0.0)
	add("q2", "q2-1", "verifier", 0.0, "searcher", -0.01, "verifier", 0.0, "answerer", 0.0)
	add("q2", "q2-2", "verifier", 0.0, "answerer", 0.0)
	return out
}

func TestGroupCounts(t *testing.T) {
	tests := []struct {
		name                                     string
		opt                                      Options
		norm, zero, single, floored, trajs, grps int
	}{
		// (uid, agent) groups: q1 verifier, searcher, answerer (none constant); q2 verifier and
		// answerer constant (0), searcher {0, −0.01}.
		{"drmas", DrMAS(), 6, 2, 0, 0, 6, 2},
		// min_std 0.1 floors the three q2 groups (σ ≤ 0.0071, the two constant ones included), none of q1's
		// (its smallest σ, the searcher's std{1, −0.01}, is 0.714).
		{"drmas min_std", with(DrMAS(), func(o *Options) { o.MinStd = 0.1 }), 6, 2, 0, 3, 6, 2},
		// uid groups: q1 s̄ = {1, 0, −0.0025}, q2 s̄ = {0, −0.0025, 0}: neither constant.
		{"grpo", GRPO(), 2, 0, 0, 0, 6, 2},
		{"grpo min_std", with(GRPO(), func(o *Options) { o.MinStd = 0.01 }), 2, 0, 0, 1, 6, 2},
		{"agent mean, no std", combo(Agent, None), 6, 2, 0, 0, 6, 2},
		{"global mean, no std", combo(Global, None), 2, 0, 0, 0, 6, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Compute(searchTeam(), tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			st := res.Stats
			if st.NormGroups != tt.norm || st.ZeroStdGroups != tt.zero || st.SingletonGroups != tt.single ||
				st.MinStdApplied != tt.floored || st.Trajectories != tt.trajs || st.Groups != tt.grps {
				t.Errorf("norm %d zero %d single %d floored %d trajs %d groups %d; want %d %d %d %d %d %d",
					st.NormGroups, st.ZeroStdGroups, st.SingletonGroups, st.MinStdApplied, st.Trajectories, st.Groups,
					tt.norm, tt.zero, tt.single, tt.floored, tt.trajs, tt.grps)
			}
			if want := float64(tt.zero) / float64(tt.norm); st.FracZeroStd != want {
				t.Errorf("frac_zero_std %g, want %g", st.FracZeroStd, want)
			}
			if st.Samples != 20 {
				t.Errorf("samples %d, want 20", st.Samples)
			}
		})
	}
}

// The searcher's spike on q2 (team reward 0, one malformed call): |A| = 0.005/√(0.00005) ≈ 0.707 with
// two calls; with eight calls, one malformed, it reaches the ≈ 2.5 docs/toy-tasks.md reports.
func TestPenaltyOnlySpike(t *testing.T) {
	var samples []Sample
	for i := range 8 {
		score := 0.0
		if i == 0 {
			score = -0.01
		}
		samples = append(samples, s("q", string(rune('a'+i)), "searcher", score))
	}
	res, err := Compute(samples, DrMAS())
	if err != nil {
		t.Fatal(err)
	}
	if a := res.Advantages[0]; a > -2.4 || a < -2.5 {
		t.Errorf("malformed call advantage %g, want ≈ −2.47", a)
	}
	floored, err := Compute(samples, with(DrMAS(), func(o *Options) { o.MinStd = 0.1 }))
	if err != nil {
		t.Fatal(err)
	}
	if a := floored.Advantages[0]; !close(a, -0.00875/(0.1+eps)) {
		t.Errorf("floored advantage %g, want %g", a, -0.00875/(0.1+eps))
	}
	if floored.Stats.MinStdApplied != 1 {
		t.Errorf("min_std applied %d, want 1", floored.Stats.MinStdApplied)
	}
}

// inflationTeam: uid u with s̄ = {1, 0, 0, 0} (μ = 0.25, unbiased σ = 0.5); agent a calls {1, 0, 0, 0}
// (μ_a = 0.25, σ_a² = 0.1875): I_a = 0.75; agent b calls {1, 1, 0, 0} (μ_b = 0.5, σ_b² = 0.25):
// I_b = (0.25 + 0.0625)/0.25 = 1.25. Uid c is constant (σ = 0) and uid o has one trajectory:
// neither counts.
var inflationTeam = []Sample{
	s("u", "t1", "a", 1), s("u", "t1", "b", 1), s("u", "t1", "b", 1),
	s("u", "t2", "a", 0), s("u", "t2", "b", 0),
	s("u", "t3", "a", 0),
	s("u", "t4", "a", 0), s("u", "t4", "b", 0),
	s("c", "t1", "a", 1), s("c", "t1", "b", 1), s("c", "t2", "a", 1), s("c", "t2", "b", 1),
	s("o", "t1", "a", 1), s("o", "t1", "b", 0),
}

func TestInflation(t *testing.T) {
	for _, opt := range []Options{GRPO(), DrMAS(), with(DrMAS(), func(o *Options) { o.Weighting = Trajectory })} {
		res, err := Compute(inflationTeam, opt)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]float64{"a": 0.75, "b": 1.25}
		if len(res.Stats.Agents) != 2 {
			t.Fatalf("%d agents, want 2", len(res.Stats.Agents))
		}
		for _, a := range res.Stats.Agents {
			if !close(a.Inflation, want[a.Agent]) || a.InflationGroups != 1 {
				t.Errorf("%s: agent %s inflation %g over %d groups, want %g over 1", opt, a.Agent, a.Inflation, a.InflationGroups, want[a.Agent])
			}
			if a.Groups != 3 {
				t.Errorf("agent %s in %d groups, want 3", a.Agent, a.Groups)
			}
		}
		g := res.Stats.PerGroup[0]
		if g.UID != "u" || !close(g.Agents[0].Inflation, 0.75) || !close(g.Agents[1].Inflation, 1.25) {
			t.Errorf("per-group inflation %+v", g)
		}
		if !math.IsNaN(res.Stats.PerGroup[1].Agents[0].Inflation) || !math.IsNaN(res.Stats.PerGroup[2].Agents[0].Inflation) {
			t.Errorf("constant and one-trajectory groups should have no inflation: %+v %+v", res.Stats.PerGroup[1], res.Stats.PerGroup[2])
		}
	}
	// Population σ for the global statistics: σ² = 0.1875, so I_a = 1, I_b = 0.3125/0.1875.
	res, err := Compute(inflationTeam[:8], with(GRPO(), func(o *Options) { o.Unbiased = false }))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := res.Stats.Agents[0].Inflation, res.Stats.Agents[1].Inflation; !close(a, 1) || !close(b, 0.3125/0.1875) {
		t.Errorf("population inflation a %g b %g, want 1 and %g", a, b, 0.3125/0.1875)
	}
}

func TestAgentStats(t *testing.T) {
	res, err := Compute(teamA, DrMAS())
	if err != nil {
		t.Fatal(err)
	}
	sd := math.Sqrt(1.0/3) + eps
	a, b := res.Stats.Agents[0], res.Stats.Agents[1]
	if a.Agent != "a" || b.Agent != "b" || a.Calls != 3 || b.Calls != 3 || a.Groups != 1 {
		t.Fatalf("agents %+v %+v", a, b)
	}
	checks := []struct {
		name      string
		got, want float64
	}{
		{"a score mean", a.ScoreMean, 2.0 / 3}, {"a score std", a.ScoreStd, math.Sqrt(2.0 / 9)},
		{"b score mean", b.ScoreMean, 1.0 / 3}, {"b score std", b.ScoreStd, math.Sqrt(2.0 / 9)},
		{"a adv mean", a.AdvMean, 0}, {"a adv std", a.AdvStd, math.Sqrt(2.0/9) / sd},
		{"a adv min", a.AdvMin, -2.0 / 3 / sd}, {"a adv max", a.AdvMax, 1.0 / 3 / sd},
		{"b adv min", b.AdvMin, -1.0 / 3 / sd}, {"b adv max", b.AdvMax, 2.0 / 3 / sd},
		{"a inflation", a.Inflation, 1}, {"b inflation", b.Inflation, 1},
	}
	for _, c := range checks {
		if !close(c.got, c.want) {
			t.Errorf("%s = %.17g, want %.17g", c.name, c.got, c.want)
		}
	}
	g := res.Stats.PerGroup[0]
	if g.UID != "u" || g.Trajectories != 3 || g.Calls != 6 || !close(g.Mean, 0.5) || !close(g.Std, 0.5) {
		t.Errorf("group %+v", g)
	}
	ga := g.Agents[0]
	if ga.Agent != "a" || ga.Calls != 3 || ga.Units != 3 || !close(ga.Mean, 2.0/3) || !close(ga.Std, math.Sqrt(1.0/3)) {
		t.Errorf("group agent %+v", ga)
	}
}

func TestAgentsSorted(t *testing.T) {
	samples := []Sample{
		s("u", "t1", "zeta", 1), s("u", "t1", "alpha", 0), s("u", "t1", "mid", 1),
		s("v", "t1", "mid", 1), s("v", "t1", "alpha", 0),
	}
	res, err := Compute(samples, DrMAS())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range res.Stats.Agents {
		names = append(names, a.Agent)
	}
	if got := strings.Join(names, ","); got != "alpha,mid,zeta" {
		t.Errorf("agents %s, want alpha,mid,zeta", got)
	}
	names = names[:0]
	for _, a := range res.Stats.PerGroup[0].Agents {
		names = append(names, a.Agent)
	}
	if got := strings.Join(names, ","); got != "alpha,mid,zeta" {
		t.Errorf("group agents %s, want alpha,mid,zeta", got)
	}
	if got := res.Stats.PerGroup[1].Agents; len(got) != 2 || got[0].Agent != "alpha" {
		t.Errorf("second group agents %+v", got)
	}
}

func TestComputeRejects(t *testing.T) {
	tests := []struct {
		name    string
		samples []Sample
		opt     Options
		want    string
	}{
		{"NaN score", []Sample{s("u", "t", "a", 1), s("u", "t", "b", math.NaN())}, DrMAS(), `sample 1 (uid "u", traj_uid "t", agent "b"): score NaN`},
		{"infinite score", []Sample{s("u", "t", "a", math.Inf(-1))}, DrMAS(), "sample 0"},
		{"huge score", []Sample{s("u", "t", "a", 1e51)}, DrMAS(), "within ±1e+50"},
		{"bad mean", nil, combo("trajectory", Agent), `mean "trajectory"`},
		{"bad std", nil, combo(Agent, "unit"), `std "unit"`},
		{"bad weighting", nil, with(DrMAS(), func(o *Options) { o.Weighting = "call" }), `weighting "call"`},
		{"zero eps", nil, with(DrMAS(), func(o *Options) { o.Eps = 0 }), "eps 0"},
		{"NaN eps", nil, with(DrMAS(), func(o *Options) { o.Eps = math.NaN() }), "eps NaN"},
		{"negative min_std", nil, with(DrMAS(), func(o *Options) { o.MinStd = -1 }), "min_std -1"},
		{"zero options", nil, Options{}, `mean ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compute(tt.samples, tt.opt)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestPreset(t *testing.T) {
	for name, want := range map[string]Options{"grpo": GRPO(), "drmas": DrMAS(), "grpo-call": GRPOCall(), "at-grpo": ATGRPO(), "role-baseline": RoleBaseline()} {
		got, err := Preset(name)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Preset(%q) = %+v, %v; want %+v", name, got, err, want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("preset %s invalid: %v", name, err)
		}
	}
	if d := DrMAS(); d.Eps != 1e-6 || !d.Unbiased || d.MinStd != 0 || d.Mean != Agent || d.Std != Agent || d.Weighting != Step {
		t.Errorf("DrMAS() = %+v", d)
	}
	if _, err := Preset("ppo"); err == nil || !strings.Contains(err.Error(), `"ppo"`) {
		t.Errorf("Preset(ppo) error %v", err)
	}
}
