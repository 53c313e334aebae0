// Package algo registers the names of the training algorithm's choices that pkg/train implements on
// libtorch: loss aggregation modes (algorithm.loss_agg_mode), KL estimators (algorithm.kl.type) and
// gradient-guard actions (algorithm.guard.action). It is libtorch-free so that pkg/config checks these
// keys without building pkg/train; pkg/train keys its implementations by these names and checks at init
// that it implements exactly them (choice.Set.Covers). A new mode is its implementation in pkg/train
// plus one line here.
package algo

import "github.com/drmas/drmas/pkg/choice"

// LossAggModes are verl's loss_agg_mode values (pkg/train/loss.go: Aggregate).
var LossAggModes = choice.NewSet("loss_agg_mode")

// Loss aggregation modes.
var (
	TokenMean           = LossAggModes.Add("token-mean")
	SeqMeanTokenSum     = LossAggModes.Add("seq-mean-token-sum")
	SeqMeanTokenMean    = LossAggModes.Add("seq-mean-token-mean")
	SeqMeanTokenSumNorm = LossAggModes.Add("seq-mean-token-sum-norm")
)

// KLTypes are verl's kl_penalty estimators (pkg/train/loss.go: KLPenalty).
var KLTypes = choice.NewSet("KL type")

// KL estimators; LowVarKL is verl's name for K3.
var (
	K1       = KLTypes.Add("k1")
	K2       = KLTypes.Add("k2")
	K3       = KLTypes.Add("k3")
	LowVarKL = KLTypes.Add("low_var_kl")
)

// GuardActions are what the per-agent gradient guard does with a spike (pkg/train/guard.go).
var GuardActions = choice.NewSet("guard action")

// Guard actions.
var (
	GuardLog  = GuardActions.Add("log")  // count it, keep the share
	GuardClip = GuardActions.Add("clip") // scale the share down to the threshold
	GuardSkip = GuardActions.Add("skip") // leave the share out of the step
)
