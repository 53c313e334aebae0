package normalize

import "math"

// The estimators, as small pure functions over one group's values. Compute composes them.
//
// Notation, for one prompt group (uid) of N trajectories τ and the agents k called in them:
//
//	sᵢ        score of call i: the trajectory's outcome reward minus that call's invalid-action penalty
//	s̄_τ       average score of the calls of trajectory τ
//	μ, σ      mean and std of the N trajectory averages s̄_τ (the global-GRPO statistics)
//	μ_k, σ_k  mean and std of agent k's call scores sᵢ in the group, with weights wᵢ:
//	          step weighting (Eq. 5): wᵢ = 1, over U_k = the agent's calls;
//	          trajectory weighting: wᵢ = 1/n_{τ,k} (n_{τ,k} = k's calls in τ), over U_k = the trajectories
//	          k was called in, so that each trajectory counts once: μ_k is the mean of k's
//	          per-trajectory averages, σ_k² = Σ wᵢ(sᵢ − μ_k)²/(U_k − 1)
//
// Stds are unbiased (divide by U − 1, the reference code) unless Unbiased is false (divide by U, the
// paper). Under trajectory weighting σ_k keeps the spread within trajectories: taken over per-trajectory
// averages alone it would be 0 in a group where every trajectory has one valid and one malformed call
// of k, and those calls would get ±penalty/(2ε).
//
// Advantage of call i of agent k in trajectory τ, for each Options combination (ε = Eps):
//
//	mean    std     A
//	global  global  (s̄_τ − μ)/(σ + ε)    vanilla GRPO; every call of τ gets the same advantage
//	global  none    s̄_τ − μ              Dr. GRPO on trajectory averages
//	agent   agent   (sᵢ − μ_k)/(σ_k + ε)  Dr. MAS (Eq. 5)
//	agent   global  (sᵢ − μ_k)/(σ + ε)    Table 3 ablation (μ_k, σ)
//	global  agent   (sᵢ − μ)/(σ_k + ε)    Table 3 ablation (μ, σ_k)
//	agent   none    sᵢ − μ_k              agent-wise Dr. GRPO; role-baseline (SPIRAL-style)
//
// Two more choices change what the statistics are taken over:
//
//	global: call        μ, σ over the uid's calls sᵢ, each call once, and s = sᵢ in every combo:
//	                    mean global, std global gives grpo-call, A = (sᵢ − μ)/(σ + ε)
//	group: agent-turn   μ_k, σ_k become μ_{k,t}, σ_{k,t}, over the calls of agent k with turn t in the
//	                    uid (turnIndex): with mean agent, std agent, at-grpo, A = (sᵢ − μ_{k,t})/(σ_{k,t} + ε)
//
// Per-agent overrides (Options.Agents) let each agent choose any of these for its own calls; the
// statistics of the group are shared, so agent a on Dr. MAS and agent b on GRPO see the same μ, σ and
// μ_k, σ_k as they would in a batch normalized wholly one way.
//
// Decisions: μ and σ are always the global-GRPO statistics over trajectory averages, whatever the combo;
// s is the trajectory average only when no agent-wise statistic is involved, the call's own score
// otherwise (an invalid-action penalty stays on the call that earned it). Where σ is used it is
// max(σ, MinStd). A group with one weighting unit (one trajectory for μ, σ; one call, or one trajectory
// under trajectory weighting, for μ_k, σ_k) gets μ = 0, σ = 1, so A = s/(1 + ε), as in the reference code.
// A group whose values are all equal gets μ equal to that value exactly and σ = 0, hence A = 0 in the
// pure combos. In a mixed combo σ can be 0 while s − μ is not: A is then (s − μ)/ε, as the formula says;
// MinStd is the guard.

// spread returns the weighted mean of x over `units` weighting units and the weighted sum of squared
// deviations:
//
//	μ = Σᵢ wᵢ xᵢ / U,   SS = Σᵢ wᵢ (xᵢ − μ)²
//
// w == nil means every wᵢ = 1 and U = len(x); with weights, the weights of one unit sum to 1. Both passes
// are explicit (no running sum of squares) so that σ stays accurate when σ ≪ |μ|. When all xᵢ are equal,
// μ is that value exactly and SS = 0: Σx/n can miss x by an ulp, which ε would then blow up into a
// nonzero advantage.
func spread(x, w []float64, units int) (mean, ss float64) {
	if len(x) == 0 || units <= 0 {
		return 0, 0
	}
	constant := true
	var sum float64
	if w == nil {
		for _, v := range x {
			sum += v
			constant = constant && v == x[0]
		}
	} else {
		for i, v := range x {
			sum += w[i] * v
			constant = constant && v == x[0]
		}
	}
	if constant {
		return x[0], 0
	}
	mean = sum / float64(units)
	if w == nil {
		for _, v := range x {
			d := v - mean
			ss += d * d
		}
	} else {
		for i, v := range x {
			d := v - mean
			ss += w[i] * d * d
		}
	}
	return mean, ss
}

// stdOf is σ = √(SS/(U − 1)) (unbiased, the reference code) or √(SS/U) (population, the paper). The
// unbiased σ of one unit is undefined and returned as 0; unitStat applies the one-sample rule instead.
func stdOf(ss float64, units int, unbiased bool) float64 {
	div := float64(units)
	if unbiased {
		div--
	}
	if div <= 0 {
		return 0
	}
	return math.Sqrt(ss / div)
}

// stat is the μ and σ an estimator uses for one group, with what Stats reports about it.
type stat struct {
	mean, std float64
	units     int  // weighting units: trajectories, calls, or trajectories per agent
	zeroStd   bool // ≥ 2 units and σ = 0
}

// unitStat turns spread's output into the group's statistics, with the one-sample rule: a group of one
// unit gets μ = 0, σ = 1, so its advantage is the raw score over 1 + ε (the reference code's choice).
func unitStat(mean, ss float64, units int, unbiased bool) stat {
	if units == 1 {
		return stat{mean: 0, std: 1, units: 1}
	}
	sd := stdOf(ss, units, unbiased)
	return stat{mean: mean, std: sd, units: units, zeroStd: sd == 0}
}

// floorStd returns max(σ, minStd) and whether the floor applied (σ < minStd).
func floorStd(std, minStd float64) (float64, bool) {
	if std < minStd {
		return minStd, true
	}
	return std, false
}

// standardize is the advantage with a scale: A = (s − μ)/(σ + ε).
func standardize(s, mean, std, eps float64) float64 { return (s - mean) / (std + eps) }

// center is the advantage without a scale (std: none, Dr. GRPO): A = s − μ.
func center(s, mean float64) float64 { return s - mean }

// trajectoryMeans writes into out[τ] the average score of trajectory τ: s̄_τ = Σ_{i∈τ} sᵢ / n_τ,
// exactly sᵢ when all of τ's calls score the same. traj[i] ∈ [0, len(out)) names the trajectory of
// call i; n and first are scratch of len(out). Scores must be finite (NaN marks a mixed trajectory).
func trajectoryMeans(x []float64, traj []int32, out []float64, n []int32, first []float64) {
	for t := range out {
		out[t], n[t] = 0, 0
	}
	for i, v := range x {
		t := traj[i]
		if n[t] == 0 {
			first[t] = v
		} else if v != first[t] {
			first[t] = math.NaN()
		}
		out[t] += v
		n[t]++
	}
	for t := range out {
		if !math.IsNaN(first[t]) { // a constant trajectory
			out[t] = first[t]
		} else {
			out[t] /= float64(n[t])
		}
	}
}

// trajectoryWeights writes wᵢ = 1/n_{τ(i)} for one agent's calls, n_τ being that agent's calls in
// trajectory τ, so that each trajectory weighs 1 in total; it returns the number of trajectories U.
// count is scratch indexed by trajectory, all zero on entry and on return.
func trajectoryWeights(traj []int32, w []float64, count []int32) (units int) {
	for _, t := range traj {
		if count[t] == 0 {
			units++
		}
		count[t]++
	}
	for i, t := range traj {
		w[i] = 1 / float64(count[t])
	}
	for _, t := range traj {
		count[t] = 0
	}
	return units
}

// turnIndex writes into turn[i] the turn of call i of one agent, whose calls are given in input order
// with their trajectories traj[i]: the number of that agent's calls earlier in the same trajectory
//
//	t(i) = |{ j < i : traj[j] = traj[i] }|
//
// so an agent's first call in a trajectory has turn 0, its second turn 1, and so on. It returns the
// number of turns, 1 + the largest t. count is scratch indexed by trajectory, all zero on entry and on
// return.
//
// AT-GRPO (arXiv 2510.11062) groups by (environment, agent, turn) over a tree: at each turn it samples K
// candidate actions of the agent from one shared state, scores each with that turn's reward (a mix of
// the team's and the agent's own), normalizes within those K candidates and continues the episode from
// the best one. Here rollouts are N independent trajectories scored by their outcome, so the calls in
// an (uid, agent, turn) group share the task, the agent and the position but not the history, and a
// turn reached by only some trajectories has a smaller group (of one: μ = 0, σ = 1).
func turnIndex(traj, turn, count []int32) (turns int32) {
	for i, t := range traj {
		turn[i] = count[t]
		count[t]++
		turns = max(turns, count[t])
	}
	for _, t := range traj {
		count[t] = 0
	}
	return turns
}

// inflation is the factor of Lemma 4.2 by which the global baseline scales agent k's expected squared
// gradient norm, relative to agent-wise normalization:
//
//	I_k = (σ_k² + (μ_k − μ)²) / σ²
//
// μ, σ are the group's global-GRPO statistics (over trajectory averages, σ > 0) and μ_k, σ_k the
// population mean and std of agent k's call scores in the group. It equals the mean over k's calls of
// ((sᵢ − μ)/σ)². Agent-wise normalization makes the corresponding factor 1.
func inflation(mean, std, meanK, stdK float64) float64 {
	d := meanK - mean
	return (stdK*stdK + d*d) / (std * std)
}
