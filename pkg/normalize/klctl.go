package normalize

import "math"

// AdaptiveKL is the adaptive KL-in-reward coefficient of Ziegler et al. (arXiv 1909.08593), as verl's
// AdaptiveKLController (used by the Dr. MAS reference's run_math_adaptive_kl.sh) updates it after
// every batch:
//
//	coef ← coef · (1 + clip(KL/target − 1, −0.2, 0.2) · n_steps/horizon)
//
// KL the batch's mean per-sequence KL(π_old ‖ π_ref) (each sequence's token mean) and n_steps the
// batch's sequences. Its state is Coef alone; a trainer saves it with its checkpoints.
type AdaptiveKL struct {
	Coef    float64 // β, the current coefficient
	Target  float64 // target KL, > 0
	Horizon float64 // horizon in sequences, > 0
}

// Update moves Coef towards the target after a batch of nSteps sequences with mean KL kl.
func (c *AdaptiveKL) Update(kl float64, nSteps int) {
	e := math.Max(-0.2, math.Min(0.2, kl/c.Target-1))
	c.Coef *= 1 + e*float64(nSteps)/c.Horizon
}
