package train

import (
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// Loss aggregation modes (verl's loss_agg_mode).
const (
	TokenMean           = "token-mean"
	SeqMeanTokenSum     = "seq-mean-token-sum"
	SeqMeanTokenMean    = "seq-mean-token-mean"
	SeqMeanTokenSumNorm = "seq-mean-token-sum-norm"
)

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
	switch kind {
	case "k1":
		return logp.MustSub(ref, false), nil
	case "k2":
		return logp.MustSub(ref, false).MustSquare(true).MustMulScalar(ts.FloatScalar(0.5), true), nil
	case "k3", "low_var_kl":
		kl := ref.MustSub(logp, false)
		return kl.MustExp(false).MustSub(kl, true).MustAddScalar(ts.FloatScalar(-1), true).
			MustClamp(ts.FloatScalar(-10), ts.FloatScalar(10), true), nil
	}
	return nil, fmt.Errorf("unknown KL type %q (k1, k2, k3, low_var_kl)", kind)
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
	lm := loss.MustMul(mask, false)
	switch mode {
	case TokenMean:
		return lm.MustSum(gotch.Float, true).MustDivScalar(ts.FloatScalar(max(d.Tokens, 1)), true), nil
	case SeqMeanTokenSum:
		return lm.MustSum(gotch.Float, true).MustDivScalar(ts.FloatScalar(max(d.Seqs, 1)), true), nil
	case SeqMeanTokenMean:
		per := lm.MustSumDimIntlist([]int64{1}, false, gotch.Float, true)
		n := mask.MustSumDimIntlist([]int64{1}, false, gotch.Float, false).MustClampMin(ts.FloatScalar(1), true)
		return per.MustDiv(n, true).MustSum(gotch.Float, true).MustDivScalar(ts.FloatScalar(max(d.Seqs, 1)), true), nil
	case SeqMeanTokenSumNorm:
		return lm.MustSum(gotch.Float, true).MustDivScalar(ts.FloatScalar(max(d.Horizon, 1)), true), nil
	}
	return nil, fmt.Errorf("unknown loss_agg_mode %q", mode)
}

// MaskedSum returns Σ x·m as a float64 (for logging).
func MaskedSum(x, mask *ts.Tensor) float64 {
	return x.MustMul(mask, false).MustSum(gotch.Double, true).Float64Values(true)[0]
}
