package train

// Off-policy correction (algorithm.rollout_correction; docs/algorithm.md). The trainer's recomputed
// log-probs are the proximal policy π_old — the PPO ratio stays π_θ/π_old — and the log-probs the
// generator reported for the sampled tokens are the behaviour policy π_b. Each token's
// policy-gradient loss is multiplied by a detached weight from r = π_old/π_b:
//
//	tis         w = min(r, C)                                  truncated IS (slime --use-tis, verl rollout_is: token)
//	token_mask  w = [1/C ≤ r ≤ C]                              masked IS / rejection per token (verl rollout_rs: token)
//	seq_mask    w = [1/C ≤ Π_t r_t ≤ C] for the whole sequence  (verl rollout_rs: sequence)
//	geo_mask    w = [1/C ≤ (Π_t r_t)^(1/T) ≤ C]                 geometric mean, per sequence (SkyRL)
//
// Tokens whose behaviour log-prob is unknown (an agent sampling at a temperature other than 1: engines
// differ on whether they report tempered log-probs) keep weight 1 and are not counted. With π_b = π_old
// every weight is exactly 1, so the update is bit-identical to none.

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/metric"
)

// RolloutWeights returns the correction's per-token weights [B, T] for log π_old and log π_b [B, T]
// over known [B, T] (1: a response token whose behaviour log-prob is known), with indicators of the
// tokens truncated (tis: r > C) and of those masked out. Weights are 1 where known is 0.
func RolloutWeights(logOld, logB, known *ts.Tensor, mode string, c float64) (w, truncated, masked *ts.Tensor, err error) {
	f, ok := corrections[mode]
	if !ok {
		return nil, nil, nil, fmt.Errorf("unknown rollout correction %q (%s)", mode, algo.RolloutCorrections)
	}
	logR := logOld.MustSub(logB, false).MustMul(known, true).MustClamp(ts.FloatScalar(-20), ts.FloatScalar(20), true)
	w, truncated, masked = f(logR, known, c)
	return w, truncated, masked, nil
}

// correcting says whether the model's loss has an off-policy correction.
func (ms *modelState) correcting() bool {
	return ms.loss.correction != "" && ms.loss.correction != algo.CorrectionNone
}

// correct multiplies the per-token policy-gradient loss by the off-policy correction's detached
// weights from the old (proximal) log-probs and the generator's, over the response tokens of the
// calls whose generator log-probs cover their response, and measures it.
func (ms *modelState) correct(pgMat, old, mask *ts.Tensor, xs []*item, width int) (*ts.Tensor, corrStats, error) {
	dev := ms.pol.Model.Device()
	served := func(x *item) []float32 {
		if len(x.served) == len(x.response) {
			return x.served
		}
		return nil
	}
	rows := make([]float32, len(xs))
	for i, x := range xs {
		if served(x) != nil {
			rows[i] = 1
		}
	}
	known := mask.MustMul(ts.MustOfSlice(rows).MustTo(dev, true).MustUnsqueeze(1, true), false)
	behav, oldD := padded(xs, width, served, dev), old.MustDetach(false)
	w, truncated, masked, err := RolloutWeights(oldD, behav, known, ms.loss.correction, ms.loss.corrC)
	if err != nil {
		return nil, corrStats{}, err
	}
	return pgMat.MustMul(w, false), measureCorrection(oldD, behav, known, w, truncated, masked), nil
}

// corrections implements each algo.RolloutCorrections name on log r (0 where unknown).
var corrections = map[string]func(logR, known *ts.Tensor, c float64) (w, truncated, masked *ts.Tensor){
	algo.CorrectionNone: func(logR, _ *ts.Tensor, _ float64) (*ts.Tensor, *ts.Tensor, *ts.Tensor) {
		z := logR.MustZerosLike(false)
		return logR.MustOnesLike(false), z, z
	},
	algo.CorrectionTIS: func(logR, known *ts.Tensor, c float64) (*ts.Tensor, *ts.Tensor, *ts.Tensor) {
		r := logR.MustExp(false)
		return r.MustClampMax(ts.FloatScalar(c), false), r.MustGt(ts.FloatScalar(c), false).MustTotype(logR.DType(), true).MustMul(known, true),
			logR.MustZerosLike(false)
	},
	algo.CorrectionTokenMask: func(logR, known *ts.Tensor, c float64) (*ts.Tensor, *ts.Tensor, *ts.Tensor) {
		return withinMask(logR, known, c)
	},
	algo.CorrectionSeqMask: func(logR, known *ts.Tensor, c float64) (*ts.Tensor, *ts.Tensor, *ts.Tensor) {
		return withinMask(logR.MustSumDimIntlist([]int64{1}, true, logR.DType(), false).MustExpandAs(logR, true), known, c)
	},
	algo.CorrectionGeoMask: func(logR, known *ts.Tensor, c float64) (*ts.Tensor, *ts.Tensor, *ts.Tensor) {
		n := known.MustSumDimIntlist([]int64{1}, true, logR.DType(), false).MustClampMin(ts.FloatScalar(1), true)
		mean := logR.MustSumDimIntlist([]int64{1}, true, logR.DType(), false).MustDiv(n, true)
		return withinMask(mean.MustExpandAs(logR, true), known, c)
	},
}

// withinMask keeps (weight 1) the tokens whose log ratio lies within [−ln C, ln C] and masks the
// others (weight 0 where known).
func withinMask(logR, known *ts.Tensor, c float64) (w, truncated, masked *ts.Tensor) {
	lnC := math.Log(c)
	out := logR.MustAbs(false).MustGt(ts.FloatScalar(lnC), true).MustTotype(logR.DType(), true).MustMul(known, true)
	return out.MustNeg(false).MustAddScalar(ts.FloatScalar(1), true), logR.MustZerosLike(false), out
}

// corrStats sums an agent's correction figures over its known tokens.
type corrStats struct {
	tokens, weight, truncated, masked, kl float64
	maxWeight                             float64
}

func (c *corrStats) add(o corrStats) {
	c.tokens, c.weight, c.truncated, c.masked, c.kl = c.tokens+o.tokens, c.weight+o.weight, c.truncated+o.truncated, c.masked+o.masked, c.kl+o.kl
	c.maxWeight = max(c.maxWeight, o.maxWeight)
}

// measureCorrection sums a micro-batch's figures: the weights over the known tokens (their mean and
// max), the fractions truncated and masked, and KL(π_b ‖ π_old) by the k3 estimator on the tokens
// π_b sampled, E_b[r − 1 − log r].
func measureCorrection(logOld, logB, known, w, truncated, masked *ts.Tensor) corrStats {
	logR := logOld.MustSub(logB, false).MustMul(known, true)
	k3 := logR.MustExp(false).MustSub(logR, false).MustAddScalar(ts.FloatScalar(-1), true)
	st := corrStats{tokens: MaskedSum(known, known), weight: MaskedSum(w, known), truncated: MaskedSum(truncated, known),
		masked: MaskedSum(masked, known), kl: MaskedSum(k3, known)}
	if st.tokens > 0 {
		st.maxWeight = w.MustMul(known, false).MustMax(true).Float64Values()[0]
	}
	return st
}

// corrOver completes the models' correction figures over the ranks: sums summed, maxima taken.
func corrOver(byAgent map[string]*corrStats, agents []string, par parallel) error {
	if len(byAgent) == 0 {
		return nil
	}
	sums := make([]float64, 0, 5*len(agents))
	maxes := make([]float64, 0, len(agents))
	for _, a := range agents {
		c := byAgent[a]
		if c == nil {
			c = &corrStats{}
			byAgent[a] = c
		}
		sums = append(sums, c.tokens, c.weight, c.truncated, c.masked, c.kl)
		maxes = append(maxes, c.maxWeight)
	}
	if err := par.sum(sums); err != nil {
		return err
	}
	if err := par.max(maxes); err != nil {
		return err
	}
	for i, a := range agents {
		v := sums[5*i : 5*i+5]
		*byAgent[a] = corrStats{tokens: v[0], weight: v[1], truncated: v[2], masked: v[3], kl: v[4], maxWeight: maxes[i]}
	}
	return nil
}

// addCorrection writes the correction figures per agent and for the model as a whole.
func (m Metrics) addCorrection(model string, byAgent map[string]*corrStats) {
	var all corrStats
	for _, a := range slices.Sorted(maps.Keys(byAgent)) { // a fixed order: the model's sums are floats
		c := byAgent[a]
		all.add(*c)
		writeCorrection(m, metric.CorrectionAgent, a, *c)
	}
	if len(byAgent) > 0 {
		writeCorrection(m, metric.CorrectionModel, model, all)
	}
}

func writeCorrection(m Metrics, key func(stat, who string) string, who string, c corrStats) {
	if c.tokens == 0 {
		return
	}
	m[key(metric.CorrWeightMean, who)] = c.weight / c.tokens
	m[key(metric.CorrWeightMax, who)] = c.maxWeight
	m[key(metric.CorrTruncated, who)] = c.truncated / c.tokens
	m[key(metric.CorrMasked, who)] = c.masked / c.tokens
	m[key(metric.CorrKL, who)] = c.kl / c.tokens
}
