package bench

import (
	"fmt"
	"math"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/microbatch"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// benchTrain times training steps on seqs. It runs on the torch thread.
func benchTrain(m *policy.Model, seqs []policy.Sequence, o Options, r *Result) error {
	opt, tensors := trainOptimizer(m)
	defer opt.Free()
	lengths := make([]int, len(seqs))
	for i, q := range seqs {
		lengths[i] = len(q.PromptIDs) + len(q.ResponseIDs)
		r.TrainRealTokens += lengths[i]
	}
	mbs := microbatch.Split(lengths, o.MicroBatch, o.MaxTokensPerMicroBatch)
	pack := o.Pack && o.MaxTokensPerMicroBatch > 0
	if pack {
		mbs = microbatch.Pack(lengths, o.MaxTokensPerMicroBatch)
	}
	r.MicroBatches, r.TrainPadding = len(mbs), microbatch.Padding(lengths, mbs)
	if pack {
		r.TrainPadding = 0 // one row a micro-batch: no padding
	}
	responseTokens := 0
	for i := range seqs {
		responseTokens += o.responseLen(i)
	}
	denom := ts.FloatScalar(float64(responseTokens))
	step := func() error {
		var sum float64
		for _, idx := range mbs {
			part := make([]policy.Sequence, len(idx))
			for j, i := range idx {
				part[j] = seqs[i]
			}
			loss, err := microStep(m, part, pack, o.Checkpointing, denom)
			if err != nil {
				return err
			}
			sum += loss
		}
		opt.Apply(opt.CurrentLR())
		_ = torch.NoGrad(func() error {
			for _, t := range tensors {
				if g := t.MustGrad(false); g.MustDefined() {
					g.MustZero_()
				}
			}
			return nil
		})
		if math.IsNaN(sum) {
			return fmt.Errorf("bench: loss is NaN")
		}
		torch.ReleaseMemory() // as the training loop does: trims only past a threshold
		return nil
	}
	sec, err := timeTrainSteps(o, r, step)
	if err != nil {
		return err
	}
	r.TrainMsPerStep = sec * 1000
	r.TrainTokensPerSec = float64(r.TrainRealTokens) / sec
	r.TrainGFLOPS = 3 * trainFLOPs(m.Config, mbs, lengths, o) / sec / 1e9
	return nil
}

// trainOptimizer is the optimizer drmas train takes (float32 moments, a float32 master copy of half
// weights) over m's parameters, and those parameters' tensors.
func trainOptimizer(m *policy.Model) (*optim.AdamW, []*ts.Tensor) {
	params := m.Parameters()
	names, tensors := make([]string, len(params)), make([]*ts.Tensor, len(params))
	for i, p := range params {
		names[i], tensors[i] = p.Name, p.T
	}
	return optim.NewAdamW(names, tensors, optim.AdamWOptions{LR: 1e-5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01}), tensors
}

// microStep scores one micro-batch with grad (packed into one row when pack), and runs backward on
// its share of the batch's token-mean loss (its sum over the batch's denom response tokens); it
// returns that share.
func microStep(m *policy.Model, part []policy.Sequence, pack, checkpointing bool, denom *ts.Scalar) (float64, error) {
	s := torch.NewScope()
	defer s.Close()
	score := m.TrainScore
	if pack {
		score = func(seqs []policy.Sequence, withEntropy, checkpoint bool) (policy.Scores, *policy.Backprop, error) {
			return m.TrainScorePacked(seqs, nil, withEntropy, checkpoint)
		}
	}
	sc, bp, err := score(part, false, checkpointing)
	if err != nil {
		return 0, err
	}
	// the token-mean over the whole batch: each micro-batch's sum over the batch's tokens
	loss := sc.LogProbs.MustMul(sc.Mask.MustTotype(sc.LogProbs.DType(), false), false).MustSum(gotch.Invalid, true).MustDivScalar(denom, true).MustNeg(true)
	bp.Backward(loss)
	return loss.Float64Values()[0], nil
}

// trainFLOPs is the forward's matmul FLOPs of one step: the padded work each micro-batch does.
func trainFLOPs(c arch.Config, mbs [][]int, lengths []int, o Options) float64 {
	var flops float64
	for _, idx := range mbs {
		longest, resp := 0, 0
		for _, i := range idx {
			longest, resp = max(longest, lengths[i]), max(resp, o.responseLen(i))
		}
		flops += forwardFLOPs(c, len(idx), longest, 0, resp)
	}
	return flops
}

// timeTrainSteps is timeSteps for the training step, also recording its CPU time per step in r.
func timeTrainSteps(o Options, r *Result, step func() error) (float64, error) {
	var cpu0 float64
	timed := 0
	sec, err := timeSteps(o, func() error {
		if timed == o.warmups() {
			cpu0 = cpuSeconds()
		}
		timed++
		return step()
	})
	r.TrainCPUMsPerStep = (cpuSeconds() - cpu0) * 1000 / float64(o.Steps)
	return sec, err
}
