package train

import (
	"fmt"
	"math"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// newShaping is the shaping of an algorithm section (the type is in trainer.go, beside Trainer).
func newShaping(a algo.Config) shaping {
	s := shaping{balance: a.BalanceLossByAgentFreq}
	if kr := a.KLInReward; kr.Coef > 0 {
		s.kl = &normalize.AdaptiveKL{Coef: kr.Coef, Target: kr.Target, Horizon: kr.Horizon}
		s.klType, s.adaptive = kr.Type, kr.Controller == algo.KLControllerAdaptive
	}
	return s
}

// advantages computes the iteration's advantages and training items: with KL in the reward, each
// call's score less β·Σₜ KL first; with loss balancing, each item's loss weight. The extra metrics
// (the KL controller's) go to m.
func (t *Trainer) advantages(roll *env.Rollout, samples []env.Sample, m Metrics) (normalize.Result, map[string][]*item, error) {
	ns := normSamples(samples)
	if t.shape.kl == nil && !t.shape.balance {
		adv, err := normalize.ComputeResolved(ns, t.norm)
		if err != nil {
			return adv, nil, err
		}
		return adv, t.itemsByModel(roll, samples, adv.Advantages, t.par.trainsOn(roll)), nil
	}
	perModel := t.itemsByModel(roll, samples, make([]float64, len(samples)), t.par.trainsOn(roll))
	if t.shape.kl != nil {
		if err := t.klInReward(perModel, ns, m); err != nil {
			return normalize.Result{}, nil, err
		}
	}
	adv, err := normalize.ComputeResolved(ns, t.norm)
	if err != nil {
		return adv, nil, err
	}
	var w []float64
	if t.shape.balance {
		w = normalize.LossBalanceWeights(ns)
	}
	for _, items := range perModel {
		for _, x := range items {
			x.adv = adv.Advantages[x.sample]
			if w != nil {
				x.lw = w[x.sample]
			}
		}
	}
	return adv, perModel, nil
}

// klInReward subtracts β·Σₜ kₜ from every call's score, kₜ the per-token KL estimate between the
// policy that sampled the calls (π_old, the current weights) and the model's reference, as verl's
// apply_kl_penalty does to the token-level rewards (which GRPO then sums); then it updates β from the
// batch's mean per-sequence token-mean KL over its sequences (verl's AdaptiveKLController). The
// reference and current log-probs are computed on the ranks' own calls and summed over the ranks.
func (t *Trainer) klInReward(perModel map[string][]*item, ns []normalize.Sample, m Metrics) error {
	sum := make([]float64, 2*len(ns)) // Σₜ kₜ, then the token mean, per sample
	has := make([]float64, len(ns))   // 1 where the call has response tokens
	err := torch.Do(func() error {
		for _, ms := range t.models {
			if ms.ref == nil {
				return fmt.Errorf("kl_in_reward: model %s has no reference", ms.id)
			}
			mine := localItems(perModel[ms.id])
			// The update takes these old and reference log-probs as they are (same weights, same cut).
			if err := ms.recordLogProbs(ms.pol, ms.loss.microBatches(mine, ms.loss.microBatch), func(x *item, lp []float32) { x.old = lp }); err != nil {
				return err
			}
			if err := ms.recordLogProbs(ms.ref, ms.loss.microBatches(mine, ms.loss.microBatch), func(x *item, lp []float32) { x.ref = lp }); err != nil {
				return err
			}
			for _, x := range mine {
				var s float64
				for j, lp := range x.old {
					s += klToken(t.shape.klType, float64(lp), float64(x.ref[j]))
				}
				sum[x.sample], sum[len(ns)+x.sample] = s, s/float64(len(x.old))
				has[x.sample] = 1
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := t.par.sum(sum); err != nil {
		return err
	}
	if err := t.par.sum(has); err != nil {
		return err
	}
	beta := t.shape.kl.Coef
	var mean, n float64
	for i := range ns {
		ns[i].Score -= beta * sum[i]
		mean += sum[len(ns)+i]
		n += has[i]
	}
	if n > 0 {
		mean /= n
	}
	m[metric.KLInRewardCoef], m[metric.KLInRewardKL] = beta, mean
	if t.shape.adaptive {
		t.shape.kl.Update(mean, int(n))
	}
	return nil
}

// klToken is verl's kl_penalty of one token (pkg/train/loss.go's KLPenalty, in float64), logp the
// policy's log-prob and ref the reference's.
func klToken(kind string, logp, ref float64) float64 {
	switch kind {
	case algo.K2:
		d := logp - ref
		return 0.5 * d * d
	case algo.K3, algo.LowVarKL:
		kl := ref - logp
		return math.Max(-10, math.Min(10, math.Exp(kl)-kl-1))
	}
	return logp - ref
}

// rowWeights is the items' loss weights as a column (len(xs) × 1) on dev, to scale each row of a
// per-token loss matrix.
func rowWeights(xs []*item, dev gotch.Device) *ts.Tensor {
	w := make([]float32, len(xs))
	for i, x := range xs {
		w[i] = float32(x.lw)
	}
	return ts.MustOfSlice(w).MustTo(dev, true).MustUnsqueeze(1, true)
}
