package metric

import "strconv"

// Fixed keys.
const (
	Step            = "step"             // the iteration, 1-based
	Epoch           = "epoch"            // passes over the training tasks
	RewardMean      = "reward/mean"      // mean outcome reward over the iteration's trajectories
	FracZeroStd     = "frac_zero_std"    // normalization groups with σ = 0
	MinStdApplied   = "min_std_applied"  // normalization groups whose σ was floored by min_std
	NonfiniteValues = "nonfinite_values" // the row's values that are not finite (written null)
	// Staleness is how many updates the weights that generated the iteration's rollout lag behind
	// those it trains (rollout.max_staleness ≥ 1 only).
	Staleness = "rollout/staleness"
	// OverlongCalls counts the calls whose prompt left no room in the model's context (invalid,
	// nothing generated); written only when there were some.
	OverlongCalls = "rollout/overlong_calls"
	// FilterDropped, FilterDraws and FilterGroups (algorithm.filter_groups): prompt groups dropped
	// because their calls all scored alike, batches of tasks rolled out, and groups trained on.
	FilterDropped = "rollout/filter/dropped_groups"
	FilterDraws   = "rollout/filter/draws"
	FilterGroups  = "rollout/filter/groups"

	// The outcome reward from outside (reward.type judge or remote; pkg/judge), per iteration: judge
	// requests sent, judgements served from the cache, failed judgements scored with error_score, and
	// trajectories whose reward is a judgement; POSTs to the remote endpoint and trajectories it failed
	// to score (scored with error_score).
	JudgeCalls     = "reward/judge/calls"
	JudgeCacheHits = "reward/judge/cache_hits"
	JudgeFailures  = "reward/judge/failures"
	JudgeJudged    = "reward/judge/judged"
	RemoteCalls    = "reward/remote/calls"
	RemoteFailures = "reward/remote/failures"

	// The gateway orchestra (pkg/gateway), per rollout: episodes left out after failing every attempt,
	// episodes played more than once, the part of the episodes' time their calls spent waiting for
	// completions; and the rollout's wall time split: some call generating, the endpoint serving calls
	// with none generating, no call in the endpoint (the runner's own time).
	GatewayFailed         = "rollout/gateway/failed_episodes"
	GatewayRetried        = "rollout/gateway/retried_episodes"
	GatewayGenShare       = "rollout/gateway/generation_share"
	TimeGatewayGeneration = "time/gateway/generation"
	TimeGatewayHTTP       = "time/gateway/http"
	TimeGatewayRunner     = "time/gateway/runner"

	CurriculumInjectP      = "curriculum/inject_p"
	CurriculumForceSearchP = "curriculum/force_search_p"

	// The loss figures, averaged over the iteration's optimizer steps; with several models each key is
	// per model (PerModel).
	LossPG          = "loss/pg"
	LossKL          = "loss/kl"
	LossEntropy     = "loss/entropy"
	PGClipfrac      = "pg_clipfrac"
	PGClipfracLower = "pg_clipfrac_lower"
	PPOKL           = "ppo_kl"
	// IdleCalls: calls per optimizer step left out of the backward for carrying no signal (advantage
	// 0, no KL or entropy term: their gradient is zero); IdleTokenFrac: their share of the response
	// tokens. Written only when there were some.
	IdleCalls     = "update/idle_calls"
	IdleTokenFrac = "update/idle_token_frac"

	// Wall-clock and process figures (time/*, perf/*), left out of any determinism comparison.
	TimeRollout    = "time/rollout"
	TimeUpdate     = "time/update"
	TimeIteration  = "time/iteration"
	TimeComm       = "time/comm"
	TimeWeightSync = "time/weight_sync"
	TimeValidation = "time/validation"
	// TimeRolloutWait: after the update, waiting for the rollout generated meanwhile (pipeline).
	TimeRolloutWait = "time/rollout_wait"
	// The update's split, over the models: the old and the reference log-probs recomputed, the
	// forward/backward passes (with the gradient collectives), the optimizer steps (norm, clip, AdamW).
	TimeOldLogProb    = "time/old_log_prob"
	TimeRefLogProb    = "time/ref_log_prob"
	TimeBackward      = "time/forward_backward"
	TimeOptimizerStep = "time/optimizer_step"
	PerfTokensPerS    = "perf/tokens_per_s"
	PerfRSSMB         = "perf/rss_mb"
	PerfCHeapMB       = "perf/c_heap_mb"
	PerfCHeapFreeMB   = "perf/c_heap_free_mb"
	PerfGoHeapMB      = "perf/go_heap_mb"
)

// Per agent.

func RewardAgent(agent string) string         { return "reward/agent/" + agent }
func ScoreStdAgent(agent string) string       { return "score_std/agent/" + agent }
func RoleRewardAgent(agent string) string     { return "role_reward/agent/" + agent }
func CallsAgent(agent string) string          { return "calls/agent/" + agent }
func InvalidAgent(agent string) string        { return "invalid/agent/" + agent }
func ResponseLengthAgent(agent string) string { return "response_length/agent/" + agent }
func AdvMeanAgent(agent string) string        { return "adv/agent/" + agent + "/mean" }
func AdvStdAgent(agent string) string         { return "adv/agent/" + agent + "/std" }
func AdvMinAgent(agent string) string         { return "adv/agent/" + agent + "/min" }
func AdvMaxAgent(agent string) string         { return "adv/agent/" + agent + "/max" }
func InflationAgent(agent string) string      { return "inflation/agent/" + agent }
func EnergyRatioAgent(agent string) string    { return "adv_energy_ratio/agent/" + agent }
func GradNormAgent(agent string) string       { return "grad_norm/agent/" + agent }
func GradNormMeanAgent(agent string) string   { return "grad_norm_mean/agent/" + agent }
func GuardAgent(agent string) string          { return "guard/agent/" + agent }
func GuardNonfiniteAgent(agent string) string { return "guard/nonfinite/agent/" + agent }

// The agent's token means over the response tokens trained in the iteration: the PPO clip
// fractions and ppo_kl, and the KL penalty to the reference and the entropy where its loss has them.
func PGClipfracAgent(agent string) string      { return "pg_clipfrac/agent/" + agent }
func PGClipfracLowerAgent(agent string) string { return "pg_clipfrac_lower/agent/" + agent }
func PPOKLAgent(agent string) string           { return "ppo_kl/agent/" + agent }
func KLAgent(agent string) string              { return "kl/agent/" + agent }
func EntropyAgent(agent string) string         { return "entropy/agent/" + agent }

// Per model.

func GradNormModel(id string) string        { return "grad_norm/model/" + id }
func GradNormMeanModel(id string) string    { return "grad_norm_mean/model/" + id }
func NonfiniteModel(id string) string       { return "nonfinite/model/" + id }
func LRModel(id string) string              { return "lr/model/" + id }
func LogprobDiffMeanModel(id string) string { return "rollout/logprob_diff/" + id + "/mean" }
func LogprobDiffMaxModel(id string) string  { return "rollout/logprob_diff/" + id + "/max" }
func ReplicasModel(id string) string        { return "rollout/replicas/" + id }

// RestartsModel counts the restarts of a model's managed replicas (engine: managed) since the run
// (process) started.
func RestartsModel(id string) string { return "rollout/restarts/" + id }

// ReloadedAheadModel counts a model's replicas that loaded an iteration's new weights in turn while
// the rollout generated ahead still ran on the others (rollout.max_staleness, several replicas).
func ReloadedAheadModel(id string) string { return "rollout/reloaded_ahead/" + id }

// PerfTokensPerSModel is a model's sequence tokens (prompt + response) trained per second of its own
// update (its log-prob passes, forward/backward passes and optimizer steps; this rank's calls).
func PerfTokensPerSModel(id string) string { return "perf/tokens_per_s/" + id }

// PerfMFUModel is a model's FLOPs utilization over its own update: its model FLOPs (pkg/flops: 6·N
// per token and the attention term for a training pass, 2·N for a log-prob pass) per second over
// its device's peak; written where the peak is known (run.peak_tflops, or a GPU of pkg/flops' table).
func PerfMFUModel(id string) string { return "perf/mfu/" + id }

// A mixture-of-experts model's routing in its training passes (algorithm.routing_replay), over the
// tokens whose generator's experts are known, averaged over its sparse layers and per range of
// layers ("0-11"): RoutingMismatch is the fraction routed to other experts than the generator's (0
// with replay), RoutingDrift the fraction whose live router's top-k is another set than the
// generator's (how far the router moved, replay or not); LossRouterAux is the router's
// load-balancing loss (added to the loss times router_aux_loss_coef when output_router_logits).
func RoutingMismatchModel(id string) string { return "routing/mismatch/" + id }
func RoutingDriftModel(id string) string    { return "routing/drift/" + id }
func RoutingMismatchLayers(id, layers string) string {
	return "routing/mismatch/" + id + "/layers_" + layers
}
func RoutingDriftLayers(id, layers string) string { return "routing/drift/" + id + "/layers_" + layers }
func LossRouterAuxModel(id string) string         { return "loss/router_aux/" + id }

// PerfWeightsMBModel, PerfGradsMBModel and PerfOptimMBModel are the MB of a trained model's state
// this rank holds after its update: its weights (under dist.shard parameters its shards), their
// gradients (dist.shard gradients: its partition's) and its optimizer state (dist.shard optimizer
// and up: its partition's).
func PerfWeightsMBModel(id string) string { return "perf/weights_mb/" + id }
func PerfGradsMBModel(id string) string   { return "perf/grads_mb/" + id }
func PerfOptimMBModel(id string) string   { return "perf/optim_mb/" + id }

// PerModel is a loss figure's key for model id, when there are several models.
func PerModel(key, id string) string { return key + "/" + id }

// The off-policy correction's figures (algorithm.rollout_correction, when not none), per agent and per
// model, over the tokens whose behaviour log-prob is known: the weights' mean and max, the fractions
// truncated and masked, and KL(π_b ‖ π_old).
const (
	CorrWeightMean = "weight_mean"
	CorrWeightMax  = "weight_max"
	CorrTruncated  = "truncated"
	CorrMasked     = "masked"
	CorrKL         = "kl"
)

// corrStats are the correction's figures, in the table's order.
var corrStats = []string{CorrWeightMean, CorrWeightMax, CorrTruncated, CorrMasked, CorrKL}

// CorrectionAgent is "rollout_corr/<stat>/agent/<a>".
func CorrectionAgent(stat, agent string) string { return "rollout_corr/" + stat + "/agent/" + agent }

// CorrectionModel is "rollout_corr/<stat>/model/<id>".
func CorrectionModel(stat, id string) string { return "rollout_corr/" + stat + "/model/" + id }

// The Dr. MAS reference code's per-agent diagnostics (normalize.Diagnose), named as it logs them with
// drmas's agent marker: adv_diag/agent/<a>/<stat> (mean gap μ_k − μ, variance ratio σ_k²/σ², the Lemma
// 4.2 inflation factor, over the (uid, agent) groups), adv_std/agent/<a>/<stat> (σ_k over the groups)
// and adv_norm/agent/<a>/<stat> (|A| over the agent's calls).
const (
	DiagMeanGapMean    = "mean_gap_mean"
	DiagMeanGapAbsMean = "mean_gap_abs_mean"
	DiagMeanGapAbsMax  = "mean_gap_abs_max"
	DiagVarRatioMean   = "var_ratio_mean"
	DiagVarRatioMin    = "var_ratio_min"
	DiagVarRatioMax    = "var_ratio_max"
	DiagInflationMean  = "inflation_factor_mean"
	DiagInflationP95   = "inflation_factor_p95"
	DiagInflationMax   = "inflation_factor_max"

	StdMean   = "mean"
	StdMin    = "min"
	StdP5     = "p5"
	StdMedian = "median"
	StdMax    = "max"

	AbsAdvMean = "abs_mean"
	AbsAdvP99  = "abs_p99"
	AbsAdvMax  = "abs_max"
)

// StdFracBelow are the adv_std fractions of groups with σ_k below 0.001, 0.01 and 0.1 (in the order of
// normalize.StdThresholds).
var StdFracBelow = []string{"frac_below_0.001", "frac_below_0.01", "frac_below_0.1"}

var (
	diagStats   = []string{DiagMeanGapMean, DiagMeanGapAbsMean, DiagMeanGapAbsMax, DiagVarRatioMean, DiagVarRatioMin, DiagVarRatioMax, DiagInflationMean, DiagInflationP95, DiagInflationMax}
	stdStats    = append([]string{StdMean, StdMin, StdP5, StdMedian, StdMax}, StdFracBelow...)
	absAdvStats = []string{AbsAdvMean, AbsAdvP99, AbsAdvMax}
)

// AdvDiagAgent is "adv_diag/agent/<a>/<stat>".
func AdvDiagAgent(agent, stat string) string { return "adv_diag/agent/" + agent + "/" + stat }

// AdvStdDistAgent is "adv_std/agent/<a>/<stat>".
func AdvStdDistAgent(agent, stat string) string { return "adv_std/agent/" + agent + "/" + stat }

// AdvNormAgent is "adv_norm/agent/<a>/<stat>".
func AdvNormAgent(agent, stat string) string { return "adv_norm/agent/" + agent + "/" + stat }

// The adaptive KL-in-reward controller (algorithm.kl_in_reward): the coefficient β the iteration's
// rewards were shaped with, and the batch's mean per-sequence KL(π_old ‖ π_ref) that updates it.
const (
	KLInRewardCoef = "kl_in_reward/coef"
	KLInRewardKL   = "kl_in_reward/kl"
)

// Validation (on validation iterations only): the figures of k samples per question, per dataset and
// averaged over the datasets, and the per-agent figures under Val.

func ValAvgAt(k int) string                        { return valAvgAt(strconv.Itoa(k)) }
func ValPassAt(k int) string                       { return valPassAt(strconv.Itoa(k)) }
func ValDatasetAvgAt(dataset string, k int) string { return valDatasetAvgAt(dataset, strconv.Itoa(k)) }
func ValDatasetPassAt(dataset string, k int) string {
	return valDatasetPassAt(dataset, strconv.Itoa(k))
}

// Val is a rollout key (CallsAgent, RewardAgent, …) measured on the validation rollouts.
func Val(key string) string { return "val/" + key }

func valAvgAt(k string) string                  { return "val/avg@" + k }
func valPassAt(k string) string                 { return "val/pass@" + k }
func valDatasetAvgAt(dataset, k string) string  { return "val/" + dataset + "/avg@" + k }
func valDatasetPassAt(dataset, k string) string { return "val/" + dataset + "/pass@" + k }

// The placeholders of Families, as docs/contracts.md writes them.
const (
	AnAgent  = "<a>"
	AModel   = "<id>"
	ADataset = "<dataset>"
	AK       = "<k>"
	ALayers  = "<l0>-<l1>" // a range of layers
)

// Families lists every key and key family of the table, a family with its placeholders (AnAgent,
// AModel, ADataset, AK, ALayers): "grad_norm/agent/<a>".
func Families() []string {
	out := []string{Step, Epoch, RewardMean, FracZeroStd, MinStdApplied, NonfiniteValues, OverlongCalls, FilterDropped, FilterDraws, FilterGroups, Staleness,
		CurriculumInjectP, CurriculumForceSearchP,
		JudgeCalls, JudgeCacheHits, JudgeFailures, JudgeJudged, RemoteCalls, RemoteFailures,
		TimeRollout, TimeUpdate, TimeIteration, TimeComm, TimeWeightSync, TimeValidation,
		TimeOldLogProb, TimeRefLogProb, TimeBackward, TimeOptimizerStep, TimeRolloutWait,
		GatewayFailed, GatewayRetried, GatewayGenShare, TimeGatewayGeneration, TimeGatewayHTTP, TimeGatewayRunner,
		PerfTokensPerS, PerfRSSMB, PerfCHeapMB, PerfCHeapFreeMB, PerfGoHeapMB}
	for _, k := range []string{LossPG, LossKL, LossEntropy, PGClipfrac, PGClipfracLower, PPOKL, IdleCalls, IdleTokenFrac} {
		out = append(out, k, PerModel(k, AModel))
	}
	rollout := []func(string) string{RewardAgent, ScoreStdAgent, RoleRewardAgent, CallsAgent, InvalidAgent, ResponseLengthAgent}
	for _, f := range rollout {
		out = append(out, f(AnAgent))
	}
	for _, f := range []func(string) string{AdvMeanAgent, AdvStdAgent, AdvMinAgent, AdvMaxAgent, InflationAgent, EnergyRatioAgent,
		GradNormAgent, GradNormMeanAgent, GuardAgent, GuardNonfiniteAgent,
		PGClipfracAgent, PGClipfracLowerAgent, PPOKLAgent, KLAgent, EntropyAgent} {
		out = append(out, f(AnAgent))
	}
	for _, f := range []func(string) string{GradNormModel, GradNormMeanModel, NonfiniteModel, LRModel,
		LogprobDiffMeanModel, LogprobDiffMaxModel, ReplicasModel, RestartsModel, ReloadedAheadModel, PerfTokensPerSModel, PerfMFUModel,
		PerfWeightsMBModel, PerfGradsMBModel, PerfOptimMBModel, RoutingMismatchModel, RoutingDriftModel, LossRouterAuxModel} {
		out = append(out, f(AModel))
	}
	out = append(out, RoutingMismatchLayers(AModel, ALayers), RoutingDriftLayers(AModel, ALayers))
	for _, st := range diagStats {
		out = append(out, AdvDiagAgent(AnAgent, st))
	}
	for _, st := range stdStats {
		out = append(out, AdvStdDistAgent(AnAgent, st))
	}
	for _, st := range absAdvStats {
		out = append(out, AdvNormAgent(AnAgent, st))
	}
	out = append(out, KLInRewardCoef, KLInRewardKL)
	for _, st := range corrStats {
		out = append(out, CorrectionAgent(st, AnAgent), CorrectionModel(st, AModel))
	}
	out = append(out, valAvgAt(AK), valPassAt(AK), valDatasetAvgAt(ADataset, AK), valDatasetPassAt(ADataset, AK))
	for _, f := range rollout {
		out = append(out, Val(f(AnAgent)))
	}
	return out
}
