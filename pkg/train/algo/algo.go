package algo

import "github.com/drmas/drmas/pkg/choice"

// Loss aggregation modes: verl's loss_agg_mode values (pkg/train/loss.go: Aggregate).
const (
	TokenMean           = "token-mean"
	SeqMeanTokenSum     = "seq-mean-token-sum"
	SeqMeanTokenMean    = "seq-mean-token-mean"
	SeqMeanTokenSumNorm = "seq-mean-token-sum-norm"
)

// LossAggModes registers the loss aggregation modes.
var LossAggModes = choice.NewSet("loss_agg_mode", TokenMean, SeqMeanTokenSum, SeqMeanTokenMean, SeqMeanTokenSumNorm)

// KL estimators: verl's kl_penalty (pkg/train/loss.go: KLPenalty); LowVarKL is verl's name for K3.
const (
	K1       = "k1"
	K2       = "k2"
	K3       = "k3"
	LowVarKL = "low_var_kl"
)

// KLTypes registers the KL estimators.
var KLTypes = choice.NewSet("KL type", K1, K2, K3, LowVarKL)

// Guard actions: what the per-agent gradient guard does with a spike (pkg/train/guard.go).
const (
	GuardLog  = "log"  // count it, keep the share
	GuardClip = "clip" // scale the share down to the threshold
	GuardSkip = "skip" // leave the share out of the step
)

// GuardActions registers the guard actions.
var GuardActions = choice.NewSet("guard action", GuardLog, GuardClip, GuardSkip)
