package normalize

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
)

// computer holds one Compute call's state: per-group scratch sized to the largest group, and the
// per-agent accumulators.
type computer struct {
	opt     Options
	samples []Sample
	idx     index
	adv     []float64

	// Scratch for the current group, indexed by its calls j (input order) …
	x  []float64 // score
	tr []int32   // trajectory, local to the group
	la []int32   // agent, local to the group
	// … by its trajectories …
	tm, tfirst []float64
	tn, tcount []int32
	// … and by its calls sorted by agent.
	sx []float64
	st []int32
	si []int32 // sample index
	sw []float64
	// Agent-turn grouping only: each sorted call's turn, and room to sort one agent's calls by turn.
	turn, tturn []int32
	tx          []float64
	tt, ti      []int32
	// Agents: global ids for the whole batch (interned as the groups are gathered), local ids for the
	// current group, and where each local agent's calls start in the sorted scratch.
	agents     interner
	local      []int32 // by global agent id; −1 when not in the group
	global     []int32 // by local agent id
	agentStart []int32
	trajs      interner
	optOf      []Options // by global agent id: the options the agent uses

	// The current group's global statistics, computed on first use: by [OverCalls?][unbiased?].
	glob       [2][2]stat
	globValid  [2][2]bool
	globCounts bool // the uid's global normalization group is counted

	noGroups bool // keep no per-group statistics (Stream.DropGroupStats)

	agg      []agentAgg // by global agent id
	stats    Stats
	perAgent []GroupAgentStats   // the current chunk of the groups' entries (see group)
	perGroup [][]GroupAgentStats // each group's entries, a slice of a chunk
}

// agentAgg accumulates one agent's figures over the groups. Spreads are kept as sums of deviations
// from the agent's first value, and their squares, which stay accurate when the mean is far from 0.
type agentAgg struct {
	calls, groups, inflGroups    int
	scoreShift, scoreSum, score2 float64
	advShift, advSum, adv2       float64
	advMin, advMax, inflSum      float64
	energy                       float64 // ΣA²
}

func newComputer(samples []Sample, opt Options, idx index) *computer {
	maxGroup := 0
	for g := range idx.uids {
		maxGroup = max(maxGroup, int(idx.start[g+1]-idx.start[g]))
	}
	c := &computer{
		opt: opt, samples: samples, idx: idx,
		adv:      make([]float64, len(samples)),
		perAgent: make([]GroupAgentStats, 0, min(len(samples), 4*len(idx.uids))),
		perGroup: make([][]GroupAgentStats, 0, len(idx.uids)),
	}
	c.grow(maxGroup)
	c.stats = Stats{Options: opt, Samples: len(samples), Groups: len(idx.uids), PerGroup: make([]GroupStats, 0, len(idx.uids))}
	return c
}

// grow sizes the per-group scratch for groups of up to m calls.
func (c *computer) grow(m int) {
	if len(c.x) >= m && c.x != nil {
		return
	}
	c.x, c.tr, c.la = make([]float64, m), make([]int32, m), make([]int32, m)
	c.tm, c.tfirst = make([]float64, m), make([]float64, m)
	c.tn, c.tcount = make([]int32, m), make([]int32, m+1)
	c.sx, c.st, c.si = make([]float64, m), make([]int32, m), make([]int32, m)
	c.sw = make([]float64, m)
	opt := c.opt
	if opt.Group == ByAgentTurn || slices.ContainsFunc(slices.Collect(maps.Values(opt.Agents)), func(o Options) bool { return o.Group == ByAgentTurn }) {
		c.turn, c.tturn = make([]int32, m), make([]int32, m)
		c.tx, c.tt, c.ti = make([]float64, m), make([]int32, m), make([]int32, m)
	}
}

// group computes the advantages of prompt group g: trajectory averages and the global statistics,
// then per agent its statistics and its calls' advantages.
func (c *computer) group(g int) {
	opt := c.opt
	lo, hi := c.idx.start[g], c.idx.start[g+1]
	m := int(hi - lo)
	c.gather(lo, m)

	nt := len(c.trajs.names)
	tm := c.tm[:nt]
	trajectoryMeans(c.x[:m], c.tr[:m], tm, c.tn[:nt], c.tfirst[:nt])
	c.globValid, c.globCounts = [2][2]bool{}, false
	glob := c.globalStat(m, OverTrajectories, opt.Unbiased)
	c.stats.Trajectories += nt

	c.sortByAgent(lo, m)
	// A group has at most one entry per call (one per agent, or per agent and turn). When the chunk
	// cannot hold that many more, a new one starts: entries are never copied as they accumulate
	// (agent-turn grouping makes several per agent), and the groups already done keep their slices.
	if cap(c.perAgent)-len(c.perAgent) < m {
		c.perAgent = make([]GroupAgentStats, 0, max(m, cap(c.perAgent)))
	}
	perStart := len(c.perAgent)
	for k := range c.global {
		c.agent(k, m, nt, glob)
	}
	if len(c.perAgent)-perStart > 1 {
		slices.SortFunc(c.perAgent[perStart:], func(p, q GroupAgentStats) int {
			if d := strings.Compare(p.Agent, q.Agent); d != 0 {
				return d
			}
			return cmp.Compare(p.Turn, q.Turn)
		})
	}
	if c.noGroups { // a Stream that keeps no per-group statistics
		c.perAgent = c.perAgent[:perStart]
	} else {
		c.perGroup = append(c.perGroup, c.perAgent[perStart:len(c.perAgent):len(c.perAgent)])
		c.stats.PerGroup = append(c.stats.PerGroup, GroupStats{
			UID: c.idx.uids[g], Trajectories: nt, Calls: m, Mean: glob.mean, Std: glob.std,
		})
	}
	for _, a := range c.global {
		c.local[a] = -1
	}
}

// sampleIndex is the input index of the group's call at position p of the group's range.
func (c *computer) sampleIndex(p int32) int32 {
	if c.idx.order != nil {
		return c.idx.order[p]
	}
	return p
}

// gather copies the scores of the group's m calls starting at lo into x and gives its trajectories and
// agents local ids (tr, la; global ↔ local agent ids in global and local), counting calls per agent.
func (c *computer) gather(lo int32, m int) {
	c.trajs.reset()
	c.global = c.global[:0]
	c.agentStart = c.agentStart[:0]
	for j := range m {
		i := c.sampleIndex(lo + int32(j))
		x := &c.samples[i]
		c.x[j] = x.Score
		c.tr[j] = c.trajs.id(x.TrajUID)
		a := c.agents.id(x.Agent)
		if int(a) == len(c.local) { // an agent new to the batch
			c.local = append(c.local, -1)
			c.agg = append(c.agg, agentAgg{})
			c.optOf = append(c.optOf, c.opt.For(x.Agent))
		}
		k := c.local[a]
		if k < 0 {
			k = int32(len(c.global))
			c.local[a] = k
			c.global = append(c.global, a)
			c.agentStart = append(c.agentStart, 0)
		}
		c.la[j] = k
		c.agentStart[k]++
	}
}

// sortByAgent is a counting sort of the gathered calls by local agent: afterwards agent k's calls are
// sx, st, si [agentStart[k]:agentStart[k+1]], in input order.
func (c *computer) sortByAgent(lo int32, m int) {
	nk := len(c.global)
	sum := int32(0)
	for k := range nk {
		sum, c.agentStart[k] = sum+c.agentStart[k], sum
	}
	c.agentStart = append(c.agentStart, sum)
	for j := range m {
		k := c.la[j]
		p := c.agentStart[k]
		c.sx[p], c.st[p], c.si[p] = c.x[j], c.tr[j], c.sampleIndex(lo+int32(j))
		c.agentStart[k]++
	}
	for k := nk; k > 0; k-- { // the counters now hold the ends: shift them back to starts
		c.agentStart[k] = c.agentStart[k-1]
	}
	c.agentStart[0] = 0
}

// globalStat returns the current group's μ and σ (before the MinStd floor) over its nt trajectory
// averages or its m calls, with the one-sample rule.
func (c *computer) globalStat(m int, over string, unbiased bool) stat {
	i, j := b2i(over == OverCalls), b2i(unbiased)
	if !c.globValid[i][j] {
		var mean, ss float64
		units := len(c.trajs.names)
		if over == OverCalls {
			units = m
			mean, ss = spread(c.x[:m], nil, m)
		} else {
			mean, ss = spread(c.tm[:units], nil, units)
		}
		c.glob[i][j], c.globValid[i][j] = unitStat(mean, ss, units, unbiased), true
	}
	return c.glob[i][j]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// agent computes the inflation factor of the current group's local agent k and the advantages of its
// calls under the agent's options; the group has m calls and nt trajectories, and traj is its global
// statistics over trajectory averages under the top-level options.
func (c *computer) agent(k, m, nt int, traj stat) {
	a := c.global[k]
	o := c.optOf[a]
	lo, hi := c.agentStart[k], c.agentStart[k+1]
	xs := c.sx[lo:hi]

	// The inflation factor, from the population statistics of the agent's calls.
	infl := math.NaN()
	if nt >= 2 && traj.std > 0 {
		pmean, pss := spread(xs, nil, len(xs))
		infl = inflation(traj.mean, traj.std, pmean, stdOf(pss, len(xs), false))
		c.agg[a].inflSum += infl
		c.agg[a].inflGroups++
	}
	c.agg[a].groups++

	// The global statistics this agent's options use, and its σ floored.
	glob := c.globalStat(m, o.Global, o.Unbiased)
	sigma := glob.std
	if o.Std == Global || (o.Std == None && o.Mean == Global) {
		floored := false
		if o.Std == Global {
			sigma, floored = floorStd(sigma, o.MinStd)
		}
		if !c.globCounts {
			c.countNormGroup(glob, floored)
			c.globCounts = true
		}
	}

	if o.Group == ByAgentTurn && o.usesAgentStats() {
		turns := c.sortByTurn(lo, hi)
		start := lo
		for t := int32(0); t < turns; t++ {
			end := start
			for end < hi && c.turn[end] == t {
				end++
			}
			c.segment(a, o, start, end, glob.mean, sigma, infl, t)
			start = end
		}
		return
	}
	c.segment(a, o, lo, hi, glob.mean, sigma, infl, -1)
}

// segment computes the agent-wise statistics of the calls sx[lo:hi] of agent a (all its calls in the
// group, or under agent-turn grouping those of turn ≥ 0), then their advantages under o, with the
// global μ and floored σ given; infl is the agent's inflation factor in the group.
func (c *computer) segment(a int32, o Options, lo, hi int32, gmean, sigma, infl float64, turn int32) {
	xs := c.sx[lo:hi]
	kmean, kss := spread(xs, nil, len(xs))
	units := len(xs)
	if o.Weighting == Trajectory {
		w := c.sw[lo:hi]
		units = trajectoryWeights(c.st[lo:hi], w, c.tcount)
		kmean, kss = spread(xs, w, units)
	}
	ks := unitStat(kmean, kss, units, o.Unbiased)

	mean := gmean
	if o.Mean == Agent {
		mean = ks.mean
	}
	sd := sigma
	if o.Std == Agent || (o.Std == None && o.Mean == Agent) {
		floored := false
		if o.Std == Agent {
			sd, floored = floorStd(ks.std, o.MinStd)
		}
		c.countNormGroup(ks, floored)
	}
	c.advantages(a, o, lo, hi, mean, sd)

	c.perAgent = append(c.perAgent, GroupAgentStats{
		Agent: c.agents.names[a], Turn: int(turn), Calls: len(xs), Units: units, Mean: ks.mean, Std: ks.std, Inflation: infl,
	})
}

// sortByTurn gives each of one agent's sorted calls sx, st, si [lo:hi] (in input order) its turn, the
// call's index among the agent's calls in its trajectory (turnIndex), and sorts them stably by turn;
// c.turn[lo:hi] holds the turns afterwards. It returns the number of turns.
func (c *computer) sortByTurn(lo, hi int32) int32 {
	turns := turnIndex(c.st[lo:hi], c.tturn[lo:hi], c.tcount)
	// A counting sort by turn: tcount (all zero) is borrowed for the turn counts.
	count := c.tcount[:turns+1]
	for _, t := range c.tturn[lo:hi] {
		count[t+1]++
	}
	for t := int32(1); t <= turns; t++ {
		count[t] += count[t-1]
	}
	for p := lo; p < hi; p++ {
		t := c.tturn[p]
		q := lo + count[t]
		count[t]++
		c.tx[q], c.tt[q], c.ti[q], c.turn[q] = c.sx[p], c.st[p], c.si[p], t
	}
	clear(count)
	copy(c.sx[lo:hi], c.tx[lo:hi])
	copy(c.st[lo:hi], c.tt[lo:hi])
	copy(c.si[lo:hi], c.ti[lo:hi])
	return turns
}

// advantages writes the advantages of agent a's calls sx[lo:hi] in the current group under o with the
// chosen μ and σ (σ unused for std: none) and accumulates the agent's figures.
func (c *computer) advantages(a int32, o Options, lo, hi int32, mean, sd float64) {
	eps, none, trajAvg := o.Eps, o.Std == None, o.usesTrajectoryAverages()
	ag := &c.agg[a]
	if ag.calls == 0 {
		ag.scoreShift, ag.advMin, ag.advMax = c.sx[lo], math.Inf(1), math.Inf(-1)
		ag.advShift = math.NaN() // set from the first advantage below
	}
	sShift, aShift := ag.scoreShift, ag.advShift
	var sSum, s2, aSum, a2, energy float64
	aMin, aMax := ag.advMin, ag.advMax
	for p := lo; p < hi; p++ {
		s := c.sx[p]
		v := s
		if trajAvg {
			v = c.tm[c.st[p]]
		}
		var adv float64
		if none {
			adv = center(v, mean)
		} else {
			adv = standardize(v, mean, sd, eps)
		}
		c.adv[c.si[p]] = adv
		if aShift != aShift { // NaN: the agent's first call
			aShift = adv
		}
		ds, da := s-sShift, adv-aShift
		sSum += ds
		s2 += ds * ds
		aSum += da
		a2 += da * da
		energy += adv * adv
		aMin = min(aMin, adv)
		aMax = max(aMax, adv)
	}
	ag.advShift = aShift
	ag.scoreSum += sSum
	ag.score2 += s2
	ag.advSum += aSum
	ag.adv2 += a2
	ag.energy += energy
	ag.advMin, ag.advMax = aMin, aMax
	ag.calls += int(hi - lo)
}

// countNormGroup records one normalization group in the stats.
func (c *computer) countNormGroup(s stat, floored bool) {
	c.stats.NormGroups++
	if s.units == 1 {
		c.stats.SingletonGroups++
	}
	if s.zeroStd {
		c.stats.ZeroStdGroups++
	}
	if floored {
		c.stats.MinStdApplied++
	}
}

// finish assembles Stats.
func (c *computer) finish() Stats {
	st := c.stats
	if st.NormGroups > 0 {
		st.FracZeroStd = float64(st.ZeroStdGroups) / float64(st.NormGroups)
	}
	for g := range st.PerGroup {
		st.PerGroup[g].Agents = c.perGroup[g]
	}
	st.Agents = make([]AgentStats, len(c.agg))
	for a, ag := range c.agg {
		n := float64(ag.calls)
		infl := math.NaN()
		if ag.inflGroups > 0 {
			infl = ag.inflSum / float64(ag.inflGroups)
		}
		scoreMean, scoreStd := shiftedMoments(ag.scoreShift, ag.scoreSum, ag.score2, n)
		advMean, advStd := shiftedMoments(ag.advShift, ag.advSum, ag.adv2, n)
		st.Agents[a] = AgentStats{
			Agent: c.agents.names[a], Calls: ag.calls, Groups: ag.groups,
			ScoreMean: scoreMean, ScoreStd: scoreStd,
			AdvMean: advMean, AdvStd: advStd, AdvMin: ag.advMin, AdvMax: ag.advMax,
			Inflation: infl, InflationGroups: ag.inflGroups, Energy: ag.energy,
		}
	}
	slices.SortFunc(st.Agents, func(p, q AgentStats) int { return strings.Compare(p.Agent, q.Agent) })
	return st
}

// shiftedMoments returns the mean and population std of n values from the sums of their deviations d
// from shift and of d².
func shiftedMoments(shift, sum, sum2, n float64) (mean, std float64) {
	d := sum / n
	return shift + d, math.Sqrt(max(sum2/n-d*d, 0))
}
