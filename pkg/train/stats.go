package train

import (
	"math"
	"runtime"
	"time"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch/ts"
)

// lossTerms are the aggregated terms of a loss (a micro-batch's, an agent's share, a mini-batch's),
// with the off-policy correction's figures over its tokens.
type lossTerms struct {
	PG, KL, Entropy float64
	corr            corrStats
	routes          routeCounts // a mixture-of-experts model's routing figures (routing.go)
}

func (l *lossTerms) add(o lossTerms) {
	l.PG, l.KL, l.Entropy = l.PG+o.PG, l.KL+o.KL, l.Entropy+o.Entropy
	l.corr.add(o.corr)
	l.routes.add(o.routes)
}

// tokenCounts are masked sums over response tokens: the token count and the numerators of
// pg_clipfrac, pg_clipfrac_lower and ppo_kl, and of the token means of the KL penalty and the
// entropy (where the loss has them).
type tokenCounts struct {
	Tokens, Clipped, ClippedLow, NegLogRatio float64
	KLSum, EntropySum                        float64
	// IdleCalls and IdleTokens: the calls (and their response tokens) left out of the backward for
	// carrying no signal (withSignal).
	IdleCalls, IdleTokens float64
}

func (c *tokenCounts) add(o tokenCounts) {
	c.Tokens, c.Clipped, c.ClippedLow, c.NegLogRatio = c.Tokens+o.Tokens, c.Clipped+o.Clipped, c.ClippedLow+o.ClippedLow, c.NegLogRatio+o.NegLogRatio
	c.KLSum, c.EntropySum = c.KLSum+o.KLSum, c.EntropySum+o.EntropySum
	c.IdleCalls, c.IdleTokens = c.IdleCalls+o.IdleCalls, c.IdleTokens+o.IdleTokens
}

// agentShare is one agent's part of a mini-batch: its share of the loss, its tokens' counts and the
// norm of the gradient of that share.
type agentShare struct {
	agent    string
	loss     lossTerms
	tokens   tokenCounts
	gradNorm float64 // as measured, before the guard
	verdict  verdict // the guard's, when it is on
}

// stepStats is what one optimizer step measured.
type stepStats struct {
	agents   []agentShare // in name order
	loss     lossTerms    // the mini-batch loss (the sum of the agents' shares)
	tokens   tokenCounts
	gradNorm float64 // pre-clip total norm (after the guard)
	skipped  bool    // non-finite norm: no step taken
	guarded  bool    // the guard left every share out: no step taken
	// backwardTime: zeroing, the forward/backward passes and the gradient collectives; stepTime: the
	// norm, the clip and the optimizer step (with the weights shared, sharded).
	backwardTime, stepTime time.Duration
}

// updateTimes split a model's update: recomputing the old and the reference log-probs, the
// forward/backward passes, the optimizer steps.
type updateTimes struct {
	oldLogProb, refLogProb, fwdBwd, optimizer time.Duration
}

// modelStats accumulates one model's optimizer steps over an iteration.
type modelStats struct {
	steps, skipped int
	loss           lossTerms // sums over the steps
	tokens         tokenCounts
	modelNorms     []float64
	agentNorms     map[string][]float64
	// The guard's counts per agent: shares beyond factor × the trailing median, non-finite shares.
	spikes, nonfiniteShares map[string]int
	agentTokens             map[string]*tokenCounts // each agent's token counts over the steps
	corr                    map[string]*corrStats   // the off-policy correction's, per agent (nil: off)
	times                   updateTimes
}

// sumOver sums the loss terms and token counts over the ranks (each rank's are sums over its own
// calls, already divided by the mini-batches' global denominators), the model's and each of agents'
// (the model's agents, in the same order on every rank).
func (s *modelStats) sumOver(sum func([]float64) error, agents []string, moe *routing) error {
	v := append([]float64{s.loss.PG, s.loss.KL, s.loss.Entropy}, s.tokens.values()...)
	depth := 0
	if moe != nil {
		depth = moe.depth
	}
	routes := len(s.loss.routes.values(depth))
	v = append(v, s.loss.routes.values(depth)...)
	for _, a := range agents {
		c := s.agentTokens[a]
		if c == nil {
			c = &tokenCounts{}
		}
		v = append(v, c.values()...)
	}
	if err := sum(v); err != nil {
		return err
	}
	s.loss = lossTerms{PG: v[0], KL: v[1], Entropy: v[2], corr: s.loss.corr}
	n := len(s.tokens.values())
	s.tokens = countsOf(v[3 : 3+n])
	if moe != nil {
		s.loss.routes.set(v[3+n:3+n+routes], depth)
	}
	v = append(v[:3+n:3+n], v[3+n+routes:]...)
	for i, a := range agents {
		if c := countsOf(v[3+n*(i+1) : 3+n*(i+2)]); c.Tokens > 0 || s.agentTokens[a] != nil {
			s.agentTokens[a] = &c
		}
	}
	return nil
}

// values are the counts in a fixed order (countsOf reads them back).
func (c tokenCounts) values() []float64 {
	return []float64{c.Tokens, c.Clipped, c.ClippedLow, c.NegLogRatio, c.KLSum, c.EntropySum, c.IdleCalls, c.IdleTokens}
}

func countsOf(v []float64) tokenCounts {
	return tokenCounts{Tokens: v[0], Clipped: v[1], ClippedLow: v[2], NegLogRatio: v[3], KLSum: v[4], EntropySum: v[5], IdleCalls: v[6], IdleTokens: v[7]}
}

func (s *modelStats) add(st stepStats) {
	s.steps++
	s.times.fwdBwd += st.backwardTime
	s.times.optimizer += st.stepTime
	if st.skipped {
		s.skipped++
	}
	s.loss.add(st.loss)
	s.tokens.add(st.tokens)
	s.modelNorms = append(s.modelNorms, st.gradNorm)
	for _, a := range st.agents {
		s.agentNorms[a.agent] = append(s.agentNorms[a.agent], a.gradNorm)
		if s.agentTokens[a.agent] == nil {
			s.agentTokens[a.agent] = &tokenCounts{}
		}
		s.agentTokens[a.agent].add(a.tokens)
		if a.verdict.spike {
			s.spikes[a.agent]++
		}
		if a.verdict.nonfinite {
			s.nonfiniteShares[a.agent]++
		}
		if s.corr != nil {
			if s.corr[a.agent] == nil {
				s.corr[a.agent] = &corrStats{}
			}
			s.corr[a.agent].add(a.loss.corr)
		}
	}
}

// addRollout writes the rollout's figures: rewards, per-agent calls, invalid rates and lengths, and
// the curriculum's schedule.
func (m Metrics) addRollout(roll *env.Rollout) {
	m[metric.RewardMean] = roll.MeanReward()
	for k, v := range env.AgentMetrics("", roll.AgentStats()) {
		m[k] = v
	}
	for k, v := range roll.Schedule.Metrics() {
		m[k] = v
	}
	if n := roll.OverlongCalls(); n > 0 { // written only when some prompt outgrew its model's context
		m[metric.OverlongCalls] = float64(n)
	}
	if f := roll.Filter; f != nil { // algorithm.filter_groups
		m[metric.FilterDropped], m[metric.FilterDraws], m[metric.FilterGroups] = float64(f.Dropped), float64(f.Draws), float64(f.Groups)
	}
	for k, v := range roll.RewardStats { // reward.type judge or remote: its counters
		m[k] = v
	}
}

// addAdvantages writes the advantage statistics, the Lemma 4.2 inflation factors and the advantage
// energy ratios ΣA²(GRPO)/ΣA²(Dr. MAS). The last two are left out of an iteration where they are
// undefined — no group of the agent's with σ > 0, so that every advantage is 0 (0/0) — rather than
// written null: a null counts in nonfinite_values, which is for numbers that went wrong (#52: the
// demo's 13 "non-finite" iterations were these, late in training when every group scored alike).
func (m Metrics) addAdvantages(st normalize.Stats, energy map[string]float64) {
	m[metric.FracZeroStd] = st.FracZeroStd
	m[metric.MinStdApplied] = float64(st.MinStdApplied)
	for _, a := range st.Agents {
		m[metric.AdvMeanAgent(a.Agent)], m[metric.AdvStdAgent(a.Agent)] = a.AdvMean, a.AdvStd
		m[metric.AdvMinAgent(a.Agent)], m[metric.AdvMaxAgent(a.Agent)] = a.AdvMin, a.AdvMax
		if isFinite(a.Inflation) {
			m[metric.InflationAgent(a.Agent)] = a.Inflation
		}
		if e, ok := energy[a.Agent]; ok && isFinite(e) {
			m[metric.EnergyRatioAgent(a.Agent)] = e
		}
	}
}

// addDiagnostics writes the reference code's per-agent diagnostics (normalize.Diagnose).
func (m Metrics) addDiagnostics(ds []normalize.AgentDiag) {
	for _, d := range ds {
		a := d.Agent
		for k, v := range map[string]float64{
			metric.DiagMeanGapMean: d.MeanGapMean, metric.DiagMeanGapAbsMean: d.MeanGapAbsMean, metric.DiagMeanGapAbsMax: d.MeanGapAbsMax,
			metric.DiagVarRatioMean: d.VarRatioMean, metric.DiagVarRatioMin: d.VarRatioMin, metric.DiagVarRatioMax: d.VarRatioMax,
			metric.DiagInflationMean: d.InflationMean, metric.DiagInflationP95: d.InflationP95, metric.DiagInflationMax: d.InflationMax,
		} {
			m[metric.AdvDiagAgent(a, k)] = v
		}
		for k, v := range map[string]float64{metric.StdMean: d.StdMean, metric.StdMin: d.StdMin, metric.StdP5: d.StdP5,
			metric.StdMedian: d.StdMedian, metric.StdMax: d.StdMax} {
			m[metric.AdvStdDistAgent(a, k)] = v
		}
		for j, k := range metric.StdFracBelow {
			m[metric.AdvStdDistAgent(a, k)] = d.StdFracBelow[j]
		}
		for k, v := range map[string]float64{metric.AbsAdvMean: d.AbsAdvMean, metric.AbsAdvP99: d.AbsAdvP99, metric.AbsAdvMax: d.AbsAdvMax} {
			m[metric.AdvNormAgent(a, k)] = v
		}
	}
}

// addModel writes one model's figures for the iteration; the loss figures carry the model id when
// there are several models.
func (m Metrics) addModel(ms *modelState, st modelStats, several bool) {
	key := func(k string) string { return k }
	if several {
		key = func(k string) string { return metric.PerModel(k, ms.id) }
	}
	m[metric.NonfiniteModel(ms.id)] = float64(st.skipped)
	if len(st.modelNorms) > 0 { // a model none of whose agents was called this iteration has no norm
		m[metric.GradNormModel(ms.id)] = maxOf(st.modelNorms)
		m[metric.GradNormMeanModel(ms.id)] = meanOf(st.modelNorms)
	}
	m[metric.LRModel(ms.id)] = ms.opt.CurrentLR()
	if ms.guard != nil {
		for _, a := range ms.agents {
			m[metric.GuardAgent(a)] = float64(st.spikes[a])
			m[metric.GuardNonfiniteAgent(a)] = float64(st.nonfiniteShares[a])
		}
	}
	for a, ns := range st.agentNorms {
		m[metric.GradNormAgent(a)] = maxOf(ns)
		m[metric.GradNormMeanAgent(a)] = meanOf(ns)
	}
	m.addAgentTokens(ms, st.agentTokens)
	if st.steps == 0 {
		return
	}
	n := float64(st.steps)
	m[key(metric.LossPG)] = st.loss.PG / n
	m[key(metric.LossKL)] = st.loss.KL / n
	if st.tokens.IdleCalls == 0 { // with calls left out it would be their share only: entropy/agent/* is over the tokens trained
		m[key(metric.LossEntropy)] = st.loss.Entropy / n
	}
	tok := math.Max(st.tokens.Tokens, 1)
	m[key(metric.PGClipfrac)] = st.tokens.Clipped / tok
	m[key(metric.PGClipfracLower)] = st.tokens.ClippedLow / tok
	m[key(metric.PPOKL)] = st.tokens.NegLogRatio / tok
	if st.tokens.IdleCalls > 0 {
		m[key(metric.IdleCalls)] = st.tokens.IdleCalls / n
		m[key(metric.IdleTokenFrac)] = st.tokens.IdleTokens / (st.tokens.IdleTokens + st.tokens.Tokens)
	}
}

// addUpdateTimes writes the update's split over the models (verl's timing_s/old_log_prob, ref, …).
func (m Metrics) addUpdateTimes(stats []modelStats) {
	var t updateTimes
	for _, st := range stats {
		t.oldLogProb += st.times.oldLogProb
		t.refLogProb += st.times.refLogProb
		t.fwdBwd += st.times.fwdBwd
		t.optimizer += st.times.optimizer
	}
	m[metric.TimeOldLogProb] = t.oldLogProb.Seconds()
	m[metric.TimeRefLogProb] = t.refLogProb.Seconds()
	m[metric.TimeBackward] = t.fwdBwd.Seconds()
	m[metric.TimeOptimizerStep] = t.optimizer.Seconds()
}

// addModels writes each model's figures and its off-policy correction's.
func (m Metrics) addModels(models []*modelState, stats []modelStats) {
	for i, ms := range models {
		m.addModel(ms, stats[i], len(models) > 1)
		m.addCorrection(ms.id, stats[i].corr)
		m.addRouting(ms.id, ms.moe, stats[i].loss.routes)
		m.addState(ms)
	}
}

// addState writes the MB of the model's training state this rank holds: weights (or shards),
// gradients, optimizer state.
func (m Metrics) addState(ms *modelState) {
	var weights, grads, optim int64
	for _, p := range ms.params {
		weights += int64(p.Numel()) * int64(p.DType().Size())
	}
	grads = heldGradElements(ms.params) * int64(ms.params[0].DType().Size())
	if o := ms.opt; o != nil {
		for _, state := range [][]*ts.Tensor{o.M, o.V, o.Master} {
			for _, t := range state {
				if t != nil {
					optim += int64(t.Numel()) * int64(t.DType().Size())
				}
			}
		}
	}
	m[metric.PerfWeightsMBModel(ms.id)] = float64(weights) / (1 << 20)
	m[metric.PerfGradsMBModel(ms.id)] = float64(grads) / (1 << 20)
	m[metric.PerfOptimMBModel(ms.id)] = float64(optim) / (1 << 20)
}

// addPipeline writes, with rollouts ahead of training, the rollout's staleness and the wait for the
// rollout generated meanwhile.
func (m Metrics) addPipeline(on bool, staleness int, wait time.Duration) {
	if on {
		m[metric.Staleness] = float64(staleness)
		m[metric.TimeRolloutWait] = wait.Seconds()
	}
}

// addTimes writes the wall-clock figures (time/*, perf/*); tokens are the sequence tokens trained on.
func (m Metrics) addTimes(rollout, update, total time.Duration, tokens int) {
	m[metric.TimeRollout] = rollout.Seconds()
	m[metric.TimeUpdate] = update.Seconds()
	m[metric.TimeIteration] = total.Seconds()
	m[metric.PerfTokensPerS] = float64(tokens) / math.Max(update.Seconds(), 1e-9)
	if rss := torch.ResidentBytes(); rss > 0 {
		m[metric.PerfRSSMB] = float64(rss) / (1 << 20)
	}
	if used, free, ok := torch.CHeap(); ok {
		m[metric.PerfCHeapMB] = float64(used) / (1 << 20)
		m[metric.PerfCHeapFreeMB] = float64(free) / (1 << 20)
	}
	var gm runtime.MemStats
	runtime.ReadMemStats(&gm)
	m[metric.PerfGoHeapMB] = float64(gm.HeapInuse) / (1 << 20)
}

// maxOf is the max over finite-or-not values: NaN if any value is NaN (a skipped step stays visible).
func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	out := xs[0]
	for _, x := range xs[1:] {
		if math.IsNaN(x) || x > out {
			out = x
		}
		if math.IsNaN(out) {
			return out
		}
	}
	return out
}

func meanOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func isFinite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// sharesKept reports whether any agent's share is in the step, and false for finite when the guard
// left every share out for being non-finite. Without the guard every share is kept.
func (st stepStats) sharesKept() (kept, finite bool) {
	if len(st.agents) == 0 {
		return true, true
	}
	finite = false
	for _, a := range st.agents {
		if a.verdict.scale != 0 || (!a.verdict.nonfinite && !a.verdict.spike) {
			return true, true
		}
		finite = finite || !a.verdict.nonfinite
	}
	return false, finite
}

// addComm writes, data-parallel, the time the iteration spent in collectives since comm0.
func (m Metrics) addComm(g *c10d.Group, comm0 time.Duration) {
	if g.Size() > 1 {
		m["time/comm"] = (g.CommTime() - comm0).Seconds()
	}
}

// addAgentTokens writes each agent's token means over the iteration's trained tokens: clip
// fractions and ppo_kl always, the KL penalty and the entropy where the agent's loss has them.
func (m Metrics) addAgentTokens(ms *modelState, byAgent map[string]*tokenCounts) {
	for a, c := range byAgent {
		if c.Tokens == 0 {
			continue
		}
		m[metric.PGClipfracAgent(a)] = c.Clipped / c.Tokens
		m[metric.PGClipfracLowerAgent(a)] = c.ClippedLow / c.Tokens
		m[metric.PPOKLAgent(a)] = c.NegLogRatio / c.Tokens
		if coef := ms.loss.agents[a]; coef.kl > 0 && ms.ref != nil {
			m[metric.KLAgent(a)] = c.KLSum / c.Tokens
		}
		m[metric.EntropyAgent(a)] = c.EntropySum / c.Tokens
	}
}
