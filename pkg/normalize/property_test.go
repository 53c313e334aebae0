package normalize

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// randomBatch draws a batch of 1–20 prompt groups of 1–8 trajectories, each of 1–6 calls by up to four
// agents (so agents are absent from some groups and called several times in others), with scores from
// a toy team's values (rewards, penalties) or uniform, in a random order.
func randomBatch(r *rand.Rand) []Sample {
	values := []float64{0, 1, -0.01, 0.99, -0.1, 0.9, 0.5}
	agents := []string{"solver", "verifier", "searcher", "answerer"}
	var out []Sample
	for g := range 1 + r.IntN(20) {
		nAgents := 1 + r.IntN(len(agents))
		for t := range 1 + r.IntN(8) {
			reward := values[r.IntN(len(values))]
			continuous := r.IntN(4) == 0
			for range 1 + r.IntN(6) {
				score := reward
				if continuous {
					score = r.Float64()*2 - 1
				} else if r.IntN(5) == 0 {
					score -= 0.01 // a malformed call
				}
				out = append(out, s(fmt.Sprintf("u%d", g), fmt.Sprintf("t%d", t), agents[r.IntN(nAgents)], score))
			}
		}
	}
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

type groupKey struct{ uid, name string }

// callGroups returns the sample indices of every (uid, agent) group and of every (uid, traj) trajectory.
func callGroups(samples []Sample) (byAgent, byTraj map[groupKey][]int, trajsOf map[string][]groupKey) {
	byAgent, byTraj, trajsOf = map[groupKey][]int{}, map[groupKey][]int{}, map[string][]groupKey{}
	for i, x := range samples {
		byAgent[groupKey{x.UID, x.Agent}] = append(byAgent[groupKey{x.UID, x.Agent}], i)
		k := groupKey{x.UID, x.TrajUID}
		if byTraj[k] == nil {
			trajsOf[x.UID] = append(trajsOf[x.UID], k)
		}
		byTraj[k] = append(byTraj[k], i)
	}
	return byAgent, byTraj, trajsOf
}

// weightedMeanStd is the plain textbook computation: mean, and std with divisor units − 1 or units.
func weightedMeanStd(x, w []float64, units float64, unbiased bool) (float64, float64) {
	var sum float64
	for i := range x {
		sum += w[i] * x[i]
	}
	mean := sum / units
	var ss float64
	for i := range x {
		ss += w[i] * (x[i] - mean) * (x[i] - mean)
	}
	if unbiased {
		units--
	}
	return mean, math.Sqrt(ss / units)
}

func distinct(x []float64) int {
	seen := map[float64]bool{}
	for _, v := range x {
		seen[v] = true
	}
	return len(seen)
}

func ones(n int) []float64 {
	w := make([]float64, n)
	for i := range w {
		w[i] = 1
	}
	return w
}

// In agent mode with std on, every (uid, agent) group with ≥ 2 distinct scores has advantages of mean 0
// and std σ_k/(σ_k + ε) = 1/(1 + ε/σ_k), under the same std estimator and weighting as the options.
func TestPropertyAgentwise(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		samples := randomBatch(r)
		opt := DrMAS()
		opt.Unbiased = iter%2 == 0
		if iter%3 == 0 {
			opt.Weighting = Trajectory
		}
		res, err := Compute(samples, opt)
		if err != nil {
			t.Fatal(err)
		}
		byAgent, _, _ := callGroups(samples)
		checked := 0
		for k, idx := range byAgent {
			scores, advs, w := make([]float64, len(idx)), make([]float64, len(idx)), ones(len(idx))
			units := float64(len(idx))
			perTraj := map[string]int{}
			for _, i := range idx {
				perTraj[samples[i].TrajUID]++
			}
			for j, i := range idx {
				scores[j], advs[j] = samples[i].Score, res.Advantages[i]
				if opt.Weighting == Trajectory {
					w[j] = 1 / float64(perTraj[samples[i].TrajUID])
				}
			}
			if opt.Weighting == Trajectory {
				units = float64(len(perTraj))
			}
			if distinct(scores) < 2 || units < 2 {
				continue
			}
			_, sigma := weightedMeanStd(scores, w, units, opt.Unbiased)
			mean, std := weightedMeanStd(advs, w, units, opt.Unbiased)
			if math.Abs(mean) > 1e-9 || math.Abs(std-1/(1+opt.Eps/sigma)) > 1e-9 {
				t.Fatalf("iter %d %s group %v: advantages mean %g std %.15g, want 0 and %.15g", iter, opt, k, mean, std, 1/(1+opt.Eps/sigma))
			}
			checked++
		}
		if iter == 0 && checked == 0 {
			t.Fatal("no group checked")
		}
	}
}

// In global mode every call of a trajectory has the same advantage, and over the uid's trajectories
// with ≥ 2 distinct averages the advantages have mean 0 and std 1/(1 + ε/σ).
func TestPropertyGlobal(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := range 300 {
		samples := randomBatch(r)
		opt := with(GRPO(), func(o *Options) { o.Unbiased = iter%2 == 0 })
		res, err := Compute(samples, opt)
		if err != nil {
			t.Fatal(err)
		}
		_, byTraj, trajsOf := callGroups(samples)
		for uid, trajs := range trajsOf {
			avgs, advs := make([]float64, len(trajs)), make([]float64, len(trajs))
			for j, k := range trajs {
				idx := byTraj[k]
				var sum float64
				for _, i := range idx {
					sum += samples[i].Score
					if res.Advantages[i] != res.Advantages[idx[0]] {
						t.Fatalf("trajectory %v: calls have advantages %g and %g", k, res.Advantages[i], res.Advantages[idx[0]])
					}
				}
				avgs[j], advs[j] = sum/float64(len(idx)), res.Advantages[idx[0]]
			}
			if distinct(avgs) < 2 {
				continue
			}
			n := float64(len(avgs))
			_, sigma := weightedMeanStd(avgs, ones(len(avgs)), n, opt.Unbiased)
			mean, std := weightedMeanStd(advs, ones(len(advs)), n, opt.Unbiased)
			if math.Abs(mean) > 1e-9 || math.Abs(std-1/(1+opt.Eps/sigma)) > 1e-9 {
				t.Fatalf("iter %d uid %s: trajectory advantages mean %g std %.15g, want 0 and %.15g", iter, uid, mean, std, 1/(1+opt.Eps/sigma))
			}
		}
	}
}

// reference computes the advantages straight from docs/algorithm.md and the header of estimators.go with maps
// and nested loops: an independent implementation for Compute to agree with on every combination,
// grouping and per-agent override.
func reference(samples []Sample, opt Options) []float64 {
	_, byTraj, trajsOf := callGroups(samples)
	// turn: the index of each call among its agent's calls in its trajectory, in input order.
	turn := make([]int, len(samples))
	seen := map[[3]string]int{}
	for i, x := range samples {
		k := [3]string{x.UID, x.TrajUID, x.Agent}
		turn[i] = seen[k]
		seen[k]++
	}
	// meanStd applies the two group rules: one unit → (0, 1); all values equal → (value, 0).
	meanStd := func(x, w []float64, units float64, unbiased bool) (float64, float64) {
		if units == 1 {
			return 0, 1
		}
		if distinct(x) == 1 {
			return x[0], 0
		}
		return weightedMeanStd(x, w, units, unbiased)
	}
	trajAvg := func(k groupKey) float64 {
		x := []float64{}
		for _, i := range byTraj[k] {
			x = append(x, samples[i].Score)
		}
		if distinct(x) == 1 {
			return x[0]
		}
		var sum float64
		for _, v := range x {
			sum += v
		}
		return sum / float64(len(x))
	}
	// global: μ, σ of a uid over its trajectory averages or its calls.
	global := func(uid string, o Options) (float64, float64) {
		var x []float64
		if o.Global == OverCalls {
			for _, y := range samples {
				if y.UID == uid {
					x = append(x, y.Score)
				}
			}
		} else {
			for _, k := range trajsOf[uid] {
				x = append(x, trajAvg(k))
			}
		}
		return meanStd(x, ones(len(x)), float64(len(x)), o.Unbiased)
	}
	// agent: μ_k, σ_k of call i's (uid, agent) or (uid, agent, turn) group, under o's weighting.
	agent := func(i int, o Options) (float64, float64) {
		x := samples[i]
		var idx []int
		for j, y := range samples {
			if y.UID == x.UID && y.Agent == x.Agent && (o.Group == ByAgent || turn[j] == turn[i]) {
				idx = append(idx, j)
			}
		}
		perTraj := map[string]float64{}
		for _, j := range idx {
			perTraj[samples[j].TrajUID]++
		}
		var scores, w []float64
		for _, j := range idx {
			scores = append(scores, samples[j].Score)
			if o.Weighting == Trajectory {
				w = append(w, 1/perTraj[samples[j].TrajUID])
			} else {
				w = append(w, 1)
			}
		}
		units := float64(len(scores))
		if o.Weighting == Trajectory {
			units = float64(len(perTraj))
		}
		return meanStd(scores, w, units, o.Unbiased)
	}
	adv := make([]float64, len(samples))
	for i, x := range samples {
		o := opt
		if a, ok := opt.Agents[x.Agent]; ok {
			o = a
		}
		mu, sigma := global(x.UID, o)
		muK, sigmaK := agent(i, o)
		s := x.Score
		if o.Mean == Global && o.Std != Agent && o.Global == OverTrajectories {
			s = trajAvg(groupKey{x.UID, x.TrajUID})
		}
		m := mu
		if o.Mean == Agent {
			m = muK
		}
		switch o.Std {
		case None:
			adv[i] = s - m
		case Global:
			adv[i] = (s - m) / (math.Max(sigma, o.MinStd) + o.Eps)
		case Agent:
			adv[i] = (s - m) / (math.Max(sigmaK, o.MinStd) + o.Eps)
		}
	}
	return adv
}

func TestMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	combos := allCombos()
	for iter := range 100 {
		samples := randomBatch(r)
		for _, opt := range combos {
			if iter%2 == 1 {
				opt.MinStd = []float64{0.001, 0.05, 0.3}[r.IntN(3)]
			}
			opt.Group = []string{ByAgent, ByAgentTurn}[r.IntN(2)]
			opt.Global = []string{OverTrajectories, OverCalls}[r.IntN(2)]
			if r.IntN(3) == 0 { // one agent on an estimator of its own
				o := combos[r.IntN(len(combos))]
				o.Group, o.Global = []string{ByAgent, ByAgentTurn}[r.IntN(2)], []string{OverTrajectories, OverCalls}[r.IntN(2)]
				opt.Agents = map[string]Options{[]string{"solver", "verifier", "searcher", "answerer"}[r.IntN(4)]: o}
			}
			res, err := Compute(samples, opt)
			if err != nil {
				t.Fatal(err)
			}
			want := reference(samples, opt)
			for i := range want {
				if math.Abs(res.Advantages[i]-want[i]) > 1e-9*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("iter %d %s: sample %d %+v: advantage %.17g, reference %.17g", iter, opt, i, samples[i], res.Advantages[i], want[i])
				}
			}
		}
	}
}

// The order of the samples changes nothing but rounding.
func TestOrderInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 50 {
		samples := randomBatch(r)
		perm := r.Perm(len(samples))
		shuffled := make([]Sample, len(samples))
		for i, p := range perm {
			shuffled[p] = samples[i]
		}
		for _, opt := range []Options{GRPO(), DrMAS(), with(DrMAS(), func(o *Options) { o.Weighting = Trajectory })} {
			a, err := Compute(samples, opt)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Compute(shuffled, opt)
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range perm {
				if math.Abs(a.Advantages[i]-b.Advantages[p]) > 1e-9*math.Max(1, math.Abs(a.Advantages[i])) {
					t.Fatalf("%s: sample %d: %g in order, %g shuffled", opt, i, a.Advantages[i], b.Advantages[p])
				}
			}
			for k := range a.Stats.Agents {
				x, y := a.Stats.Agents[k], b.Stats.Agents[k]
				if x.Agent != y.Agent || x.Calls != y.Calls || math.Abs(x.AdvStd-y.AdvStd) > 1e-9 || x.InflationGroups != y.InflationGroups {
					t.Fatalf("agent stats differ: %+v vs %+v", x, y)
				}
			}
		}
	}
}

// Lemma 4.2: the inflation factor equals the mean over agent k's calls of ((sᵢ − μ)/σ)², μ and σ the
// global-GRPO statistics. Checked per group against that direct form.
func TestPropertyInflationIdentity(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for range 100 {
		samples := randomBatch(r)
		res, err := Compute(samples, GRPO())
		if err != nil {
			t.Fatal(err)
		}
		byAgent, _, _ := callGroups(samples)
		for _, g := range res.Stats.PerGroup {
			for _, a := range g.Agents {
				if math.IsNaN(a.Inflation) {
					if g.Trajectories >= 2 && g.Std > 0 {
						t.Fatalf("group %s agent %s: no inflation although σ = %g", g.UID, a.Agent, g.Std)
					}
					continue
				}
				var direct float64
				idx := byAgent[groupKey{g.UID, a.Agent}]
				for _, i := range idx {
					z := (samples[i].Score - g.Mean) / g.Std
					direct += z * z
				}
				direct /= float64(len(idx))
				if math.Abs(a.Inflation-direct) > 1e-9*math.Max(1, direct) {
					t.Fatalf("group %s agent %s: inflation %g, direct %g", g.UID, a.Agent, a.Inflation, direct)
				}
			}
		}
	}
}
