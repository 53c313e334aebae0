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

// Where a model's AdamW state lives (models[].optim.offload).
const (
	OffloadNone = "none" // on the model's device
	OffloadCPU  = "cpu"  // in host memory, stepped there
)

// OffloadModes registers the optimizer state placements.
var OffloadModes = choice.NewSet("offload mode", OffloadNone, OffloadCPU)

// Off-policy corrections (algorithm.rollout_correction.mode): how each token's policy-gradient loss is
// weighted by the ratio r = π_old/π_b of the trainer's recomputed log-probs (the proximal policy π_old)
// to the log-probs the generator sampled with (the behaviour policy π_b), with a threshold C.
const (
	CorrectionNone      = "none"
	CorrectionTIS       = "tis"        // w = min(r, C) per token: truncated importance sampling
	CorrectionTokenMask = "token_mask" // tokens whose r leaves [1/C, C] are left out (masked IS)
	CorrectionSeqMask   = "seq_mask"   // sequences whose Π_t r leaves [1/C, C] are left out
	CorrectionGeoMask   = "geo_mask"   // sequences whose geometric-mean r leaves [1/C, C] are left out
)

// RolloutCorrections registers the off-policy corrections.
var RolloutCorrections = choice.NewSet("rollout correction", CorrectionNone, CorrectionTIS, CorrectionTokenMask, CorrectionSeqMask, CorrectionGeoMask)

// Routing replays (algorithm.routing_replay): which experts a mixture-of-experts model's training
// passes route the sampled calls' tokens to (pkg/train/routing.go).
const (
	ReplayNone    = "none"    // the live router's top-k
	ReplayRollout = "rollout" // the experts the generator used (its routed experts)
)

// RoutingReplays registers the routing replays.
var RoutingReplays = choice.NewSet("routing replay", ReplayNone, ReplayRollout)
