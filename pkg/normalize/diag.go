package normalize

import (
	"cmp"
	"math"
	"slices"
	"sort"
)

// The reference code's per-agent diagnostics (langfengQ/DrMAS, commits 40f50a1 and 755152e:
// summarize_group_diagnostics, summarize_group_std_stats and the adv_norm figures of
// compute_grpo_outcome_advantage in verl/trainer/ppo/core_algos.py), computed as it computes them so
// that a drmas run and a reference run log comparable numbers. They describe the batch and change
// nothing in training.
//
// Statistics, per prompt group (uid), with the reference's one-sample rule (one value: μ = 0, σ = 1)
// and unbiased stds:
//
//	μ, σ      over the uid's trajectory averages (vanilla GRPO's grouping)
//	μ_k, σ_k  over agent k's calls in the uid, each call once (Dr. MAS's grouping)
//
// and per (uid, agent) group:
//
//	mean_gap   = μ_k − μ
//	var_ratio  = σ_k² / (σ² + 1e−12)
//	inflation  = (σ_k² + mean_gap²) / (σ² + 1e−12)      the Lemma 4.2 multiplier
//
// These differ from Stats' inflation factors (population σ_k, groups of one trajectory or σ = 0 left
// out), which follow the paper; the diagnostics follow the reference's logging.

// StdThresholds are the σ_k thresholds of AgentDiag.StdFracBelow, as the reference writes them.
var StdThresholds = [3]float64{1e-3, 1e-2, 1e-1}

// AgentDiag is one agent's diagnostics over the batch's (uid, agent) groups and calls.
type AgentDiag struct {
	Agent  string
	Groups int // the (uid, agent) groups the figures are over

	// adv_diag: mean_gap's mean, mean |mean_gap| and max |mean_gap|; var_ratio's mean, min and max;
	// the inflation factor's mean, 95th percentile and max.
	MeanGapMean, MeanGapAbsMean, MeanGapAbsMax float64
	VarRatioMean, VarRatioMin, VarRatioMax     float64
	InflationMean, InflationP95, InflationMax  float64

	// adv_std: the distribution of σ_k over the groups (the one-sample rule's σ = 1 included), and the
	// fraction of groups with σ_k below each of StdThresholds.
	StdMean, StdMin, StdP5, StdMedian, StdMax float64
	StdFracBelow                              [3]float64

	// adv_norm: |A| over the agent's calls, A the advantages given (the estimator's).
	AbsAdvMean, AbsAdvP99, AbsAdvMax float64
}

// diagKey is a (uid, name) pair: a trajectory or an agent within a prompt group.
type diagKey struct{ uid, name string }

// Diagnose returns the diagnostics of the samples, with adv the advantages of the samples (aligned),
// per agent sorted by name. Scores are the samples' scores, as Compute reads them.
func Diagnose(samples []Sample, adv []float64) []AgentDiag {
	byAgent := diagAccumulate(samples, adv)
	out := make([]AgentDiag, 0, len(byAgent))
	for agent, a := range byAgent {
		out = append(out, a.diag(agent))
	}
	slices.SortFunc(out, func(p, q AgentDiag) int { return cmp.Compare(p.Agent, q.Agent) })
	return out
}

// diagAcc is one agent's figures before they are summarized: per (uid, agent) group its mean_gap,
// var_ratio, inflation and σ_k, and per call its |A|.
type diagAcc struct{ gap, ratio, infl, std, absAdv []float64 }

// diagAccumulate computes μ, σ per uid over the trajectory averages and μ_k, σ_k per (uid, agent)
// over the calls, and collects each agent's figures (groups in the order of their first call).
func diagAccumulate(samples []Sample, adv []float64) map[string]*diagAcc {
	trajs := map[diagKey][]float64{}
	var trajOrder []diagKey
	calls := map[diagKey][]float64{}
	var groupOrder []diagKey
	for _, s := range samples {
		tk := diagKey{s.UID, s.TrajUID}
		if _, ok := trajs[tk]; !ok {
			trajOrder = append(trajOrder, tk)
		}
		trajs[tk] = append(trajs[tk], s.Score)
		gk := diagKey{s.UID, s.Agent}
		if _, ok := calls[gk]; !ok {
			groupOrder = append(groupOrder, gk)
		}
		calls[gk] = append(calls[gk], s.Score)
	}
	perUID := map[string][]float64{}
	for _, tk := range trajOrder {
		perUID[tk.uid] = append(perUID[tk.uid], meanOf(trajs[tk]))
	}
	byAgent := map[string]*diagAcc{}
	get := func(agent string) *diagAcc {
		a := byAgent[agent]
		if a == nil {
			a = &diagAcc{}
			byAgent[agent] = a
		}
		return a
	}
	for _, gk := range groupOrder {
		mk, sk := refStat(calls[gk])
		mu, sigma := refStat(perUID[gk.uid])
		gap := mk - mu
		a := get(gk.name)
		a.gap = append(a.gap, gap)
		a.ratio = append(a.ratio, sk*sk/(sigma*sigma+1e-12))
		a.infl = append(a.infl, (sk*sk+gap*gap)/(sigma*sigma+1e-12))
		a.std = append(a.std, sk)
	}
	for i, s := range samples {
		a := get(s.Agent)
		a.absAdv = append(a.absAdv, math.Abs(adv[i]))
	}
	return byAgent
}

// diag summarizes the agent's figures as the reference logs them.
func (a *diagAcc) diag(agent string) AgentDiag {
	d := AgentDiag{Agent: agent, Groups: len(a.std)}
	if len(a.std) > 0 {
		absGap := make([]float64, len(a.gap))
		for i, g := range a.gap {
			absGap[i] = math.Abs(g)
		}
		d.MeanGapMean, d.MeanGapAbsMean, d.MeanGapAbsMax = meanOf(a.gap), meanOf(absGap), slices.Max(absGap)
		d.VarRatioMean, d.VarRatioMin, d.VarRatioMax = meanOf(a.ratio), slices.Min(a.ratio), slices.Max(a.ratio)
		d.InflationMean, d.InflationP95, d.InflationMax = meanOf(a.infl), Percentile(a.infl, 95), slices.Max(a.infl)
		d.StdMean, d.StdMin, d.StdMax = meanOf(a.std), slices.Min(a.std), slices.Max(a.std)
		d.StdP5, d.StdMedian = Percentile(a.std, 5), Percentile(a.std, 50)
		for j, th := range StdThresholds {
			below := 0
			for _, s := range a.std {
				if s < th {
					below++
				}
			}
			d.StdFracBelow[j] = float64(below) / float64(len(a.std))
		}
	}
	if len(a.absAdv) > 0 {
		d.AbsAdvMean, d.AbsAdvP99, d.AbsAdvMax = meanOf(a.absAdv), Percentile(a.absAdv, 99), slices.Max(a.absAdv)
	}
	return d
}

// refStat is the reference's group statistic: μ = 0, σ = 1 for one value, else the mean and the
// unbiased std.
func refStat(x []float64) (mean, std float64) {
	if len(x) == 1 {
		return 0, 1
	}
	mean = meanOf(x)
	var ss float64
	for _, v := range x {
		d := v - mean
		ss += d * d
	}
	return mean, math.Sqrt(ss / float64(len(x)-1))
}

// meanOf is the mean of x (NaN when empty).
func meanOf(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}

// Percentile is numpy's default percentile (linear interpolation between the closest ranks) of x,
// q in [0, 100]; x is not modified. NaN for an empty x.
func Percentile(x []float64, q float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	s := slices.Clone(x)
	sort.Float64s(s)
	pos := q / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	t := pos - float64(lo)
	a, b := s[lo], s[lo+1]
	if t >= 0.5 { // numpy's _lerp, exact at t = 1
		return b - (b-a)*(1-t)
	}
	return a + (b-a)*t
}

// LossBalanceWeights returns each sample's loss weight under invocation-frequency balancing (the
// reference's compute_loss_balance_weights, langfengQ/DrMAS commit 40f50a1):
//
//	wᵢ = (1/n_(uidᵢ, agentᵢ)) / mean_j(1/n_(uidⱼ, agentⱼ))
//
// n_(uid, agent) the agent's calls in the prompt group, so every (uid, agent) group weighs the same
// in the policy-gradient loss however often its agent was called, and the batch's weights average 1.
func LossBalanceWeights(samples []Sample) []float64 {
	n := map[diagKey]int{}
	for _, s := range samples {
		n[diagKey{s.UID, s.Agent}]++
	}
	w := make([]float64, len(samples))
	var sum float64
	for i, s := range samples {
		w[i] = 1 / float64(n[diagKey{s.UID, s.Agent}])
		sum += w[i]
	}
	mean := sum / float64(len(samples))
	for i := range w {
		w[i] /= mean
	}
	return w
}
