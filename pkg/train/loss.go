package train

import (
	"fmt"
	"maps"
	"slices"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/dist"
)

// Loss aggregation modes (verl's loss_agg_mode); the names are registered in pkg/algo.
const (
	TokenMean           = algo.TokenMean
	SeqMeanTokenSum     = algo.SeqMeanTokenSum
	SeqMeanTokenMean    = algo.SeqMeanTokenMean
	SeqMeanTokenSumNorm = algo.SeqMeanTokenSumNorm
)

// This package implements exactly the loss modes, KL types and guard actions pkg/algo registers, and
// the shard stages pkg/dist registers.
func init() {
	algo.LossAggModes.Covers(slices.Collect(maps.Keys(aggregators)))
	algo.KLTypes.Covers(slices.Collect(maps.Keys(klPenalties)))
	algo.GuardActions.Covers(slices.Collect(maps.Keys(guardScales)))
	dist.ShardStages.Covers(slices.Collect(maps.Keys(shardStages)))
}

// PGLoss is verl's clipped policy-gradient loss per token, with dual clip:
//
//	r = exp(clamp(logp − old, −20, 20))
//	L = max(−A·r, −A·clip(r, 1−clipLow, 1+clipHigh))
//	L = min(L, −A·clipC)   where A < 0 (dual clip; clipC ≤ 1 turns it off)
//
// logp, old: [B, T]; adv: [B] (one advantage per sequence). It returns the loss matrix and the
// indicator matrices of the clipped tokens (upper clip active; dual clip active) and of −log r
// (whose masked mean is ppo_kl).
func PGLoss(logp, old, adv *ts.Tensor, clipLow, clipHigh, clipC float64) (loss, clipped, clippedLower, negLogRatio *ts.Tensor) {
	a := adv.MustUnsqueeze(1, false)
	logRatio := logp.MustSub(old, false).MustClamp(ts.FloatScalar(-20), ts.FloatScalar(20), true)
	ratio := logRatio.MustExp(false)
	negA := a.MustNeg(false)
	l1 := negA.MustMul(ratio, false)
	l2 := negA.MustMul(ratio.MustClamp(ts.FloatScalar(1-clipLow), ts.FloatScalar(1+clipHigh), false), false)
	clippedL := l1.MustMaximum(l2, false)
	clipped = l2.MustGtTensor(l1, false).MustTotype(gotch.Float, true)
	loss = clippedL
	clippedLower = clippedL.MustZerosLike(false)
	if clipC > 1 {
		l3 := negA.MustMulScalar(ts.FloatScalar(clipC), false) // [B,1]
		dual := clippedL.MustMinimum(l3.MustExpandAs(clippedL, false), false)
		neg := a.MustLt(ts.FloatScalar(0), false).MustExpandAs(clippedL, true)
		loss = dual.MustWhereSelf(neg, clippedL, false)
		clippedLower = clippedL.MustGtTensor(l3, false).MustLogicalAnd(neg, true).MustTotype(gotch.Float, true)
	}
	negLogRatio = logRatio.MustNeg(false)
	return loss, clipped, clippedLower, negLogRatio
}

// KLPenalty is the per-token KL estimate between the policy and the reference (verl's kl_penalty):
//
//	k1: logp − ref
//	k2: ½(logp − ref)²
//	k3 (low_var_kl): exp(ref − logp) − (ref − logp) − 1, clamped to [−10, 10]
func KLPenalty(logp, ref *ts.Tensor, kind string) (*ts.Tensor, error) {
	if f, ok := klPenalties[kind]; ok {
		return f(logp, ref), nil
	}
	return nil, fmt.Errorf("unknown KL type %q (%s)", kind, algo.KLTypes)
}

// klPenalties implements each algo.KLTypes name.
var klPenalties = map[string]func(logp, ref *ts.Tensor) *ts.Tensor{
	algo.K1: func(logp, ref *ts.Tensor) *ts.Tensor { return logp.MustSub(ref, false) },
	algo.K2: func(logp, ref *ts.Tensor) *ts.Tensor {
		return logp.MustSub(ref, false).MustSquare(true).MustMulScalar(ts.FloatScalar(0.5), true)
	},
	algo.K3:       k3,
	algo.LowVarKL: k3,
}

func k3(logp, ref *ts.Tensor) *ts.Tensor {
	kl := ref.MustSub(logp, false)
	return kl.MustExp(false).MustSub(kl, true).MustAddScalar(ts.FloatScalar(-1), true).
		MustClamp(ts.FloatScalar(-10), ts.FloatScalar(10), true)
}

// Denominators are the mini-batch totals a micro-batch's loss is divided by, so that micro-batches
// (and agents' shares) add up to the mini-batch loss.
type Denominators struct {
	Tokens  float64 // response tokens in the mini-batch (token-mean)
	Seqs    float64 // sequences in the mini-batch (seq-mean-*)
	Horizon float64 // the constant response horizon (seq-mean-token-sum-norm): max_new_tokens
}

// Aggregate reduces a per-token loss matrix [B, T] with mask [B, T] to this micro-batch's share of
// the mini-batch loss:
//
//	token-mean:              Σ L·m / Tokens
//	seq-mean-token-sum:      Σ_seq Σ_t L·m / Seqs
//	seq-mean-token-mean:     Σ_seq (Σ_t L·m / Σ_t m) / Seqs
//	seq-mean-token-sum-norm: Σ L·m / Horizon      (Dr. GRPO; verl divides by the horizon only)
func Aggregate(loss, mask *ts.Tensor, mode string, d Denominators) (*ts.Tensor, error) {
	agg, ok := aggregators[mode]
	if !ok {
		return nil, fmt.Errorf("unknown loss_agg_mode %q", mode)
	}
	return agg(loss.MustMul(mask, false), mask, d), nil
}

// aggregators implements each algo.LossAggModes name on the masked loss lm = L·m (which it consumes),
// summing in lm's dtype (float32, or float64 for a float64 model).
var aggregators = map[string]func(lm, mask *ts.Tensor, d Denominators) *ts.Tensor{
	algo.TokenMean: func(lm, _ *ts.Tensor, d Denominators) *ts.Tensor {
		return lm.MustSum(lm.DType(), true).MustDivScalar(ts.FloatScalar(max(d.Tokens, 1)), true)
	},
	algo.SeqMeanTokenSum: func(lm, _ *ts.Tensor, d Denominators) *ts.Tensor {
		return lm.MustSum(lm.DType(), true).MustDivScalar(ts.FloatScalar(max(d.Seqs, 1)), true)
	},
	algo.SeqMeanTokenMean: func(lm, mask *ts.Tensor, d Denominators) *ts.Tensor {
		dt := lm.DType()
		per := lm.MustSumDimIntlist([]int64{1}, false, dt, true)
		n := mask.MustSumDimIntlist([]int64{1}, false, gotch.Float, false).MustClampMin(ts.FloatScalar(1), true)
		return per.MustDiv(n, true).MustSum(dt, true).MustDivScalar(ts.FloatScalar(max(d.Seqs, 1)), true)
	},
	algo.SeqMeanTokenSumNorm: func(lm, _ *ts.Tensor, d Denominators) *ts.Tensor {
		return lm.MustSum(lm.DType(), true).MustDivScalar(ts.FloatScalar(max(d.Horizon, 1)), true)
	},
}

// MaskedSum returns Σ x·m as a float64 (for logging).
func MaskedSum(x, mask *ts.Tensor) float64 {
	return x.MustMul(mask, false).MustSum(gotch.Double, true).Float64Values(true)[0]
}
