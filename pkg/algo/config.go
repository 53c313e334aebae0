package algo

import (
	"fmt"
	"math"
	"slices"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/normalize"
)

// Config is the `algorithm:` section: advantages and the policy loss.
type Config struct {
	Normalization    normalize.Spec `mapstructure:"normalization"`
	GroupSize        int            `mapstructure:"group_size"`          // rollouts per task
	BatchSize        int            `mapstructure:"batch_size"`          // tasks per iteration
	PPOMiniUpdateNum int            `mapstructure:"ppo_mini_update_num"` // optimizer steps per epoch
	PPOEpochs        int            `mapstructure:"ppo_epochs"`
	MicroBatchSize   int            `mapstructure:"micro_batch_size"` // sequences per forward/backward
	// MaxTokensPerMicroBatch > 0 cuts each agent's calls into micro-batches by padded tokens instead
	// of by count: sorted by length and packed so that rows × the longest row stays within it (a
	// longer call is a micro-batch of its own; pkg/microbatch). 0 = micro_batch_size sequences each.
	MaxTokensPerMicroBatch int     `mapstructure:"max_tokens_per_micro_batch"`
	ClipRatioLow           float64 `mapstructure:"clip_ratio_low"`
	ClipRatioHigh          float64 `mapstructure:"clip_ratio_high"`
	ClipRatioC             float64 `mapstructure:"clip_ratio_c"` // dual clip; ≤ 1 = off
	LossAggMode            string  `mapstructure:"loss_agg_mode"`
	KL                     KL      `mapstructure:"kl"`
	EntropyCoef            float64 `mapstructure:"entropy_coef"`
	MaxNonfiniteSteps      int     `mapstructure:"max_nonfinite_steps"` // abort after this many in a row
	Guard                  Guard   `mapstructure:"guard"`
	// RolloutCorrection weights each token's policy-gradient loss by the ratio of the trainer's
	// recomputed log-probs to the generator's (off-policy correction; docs/algorithm.md).
	RolloutCorrection Correction `mapstructure:"rollout_correction"`
	// BalanceLossByAgentFreq weights each call's policy-gradient loss by (1/n)/mean(1/n), n the calls of
	// its agent in its prompt group, so that an agent called several times in a group weighs as much
	// as one called once (the Dr. MAS reference's balance_loss_by_agent_freq; docs/algorithm.md).
	BalanceLossByAgentFreq bool `mapstructure:"balance_loss_by_agent_freq"`
	// KLInReward subtracts β·Σₜ KL(π_old ‖ π_ref) from each call's score before advantages (verl's
	// use_kl_in_reward), β fixed or adaptive (docs/algorithm.md).
	KLInReward KLInReward `mapstructure:"kl_in_reward"`
	// FilterGroups drops the prompt groups whose calls all score alike (no advantage under any
	// estimator) and rolls out more tasks until the batch is full (DAPO's dynamic sampling).
	FilterGroups FilterGroups `mapstructure:"filter_groups"`
	// RoutingReplay, for a mixture-of-experts model: rollout routes the trainer's passes over the
	// sampled calls through the experts the generator used (R3), the gate weights recomputed from
	// the live router; none routes them live (docs/algorithm.md).
	RoutingReplay string `mapstructure:"routing_replay"`
}

// FilterGroups is DAPO's dynamic sampling: with Enable, groups without signal are dropped and
// more batches of tasks rolled out, MaxDraws batches at most in all (DAPO's max_num_gen_batches).
type FilterGroups struct {
	Enable   bool `mapstructure:"enable"`
	MaxDraws int  `mapstructure:"max_draws"`
}

// KLInReward is the KL penalty in the reward: coef β (0 = off), the per-token estimator, and the
// controller: fixed, or adaptive towards target with horizon (verl's kl_ctrl; in sequences).
type KLInReward struct {
	Coef       float64 `mapstructure:"coef"`
	Type       string  `mapstructure:"type"`       // k1 (verl's kl) | k2 | k3 | low_var_kl
	Controller string  `mapstructure:"controller"` // fixed | adaptive
	Target     float64 `mapstructure:"target"`     // adaptive: the target KL per token
	Horizon    float64 `mapstructure:"horizon"`    // adaptive: in sequences
}

// Correction is the off-policy correction: mode none | tis | token_mask | seq_mask | geo_mask,
// with the ratio threshold C (tis truncates at C; the masks keep ratios within [1/C, C]).
type Correction struct {
	Mode      string  `mapstructure:"mode"`
	Threshold float64 `mapstructure:"threshold"`
}

// Guard is the online per-agent gradient guard: before each optimizer step, each agent's share
// of the gradient is compared with that agent's trailing median norm over the last Window steps.
type Guard struct {
	Window int     `mapstructure:"window"` // trailing steps per agent; 0 = guard off
	Factor float64 `mapstructure:"factor"` // a share above factor × the trailing median is a spike
	Action string  `mapstructure:"action"` // log | clip | skip
}

// KL is the optional KL penalty to a frozen reference (the model as it was at the start).
type KL struct {
	Coef float64 `mapstructure:"coef"` // 0 = off (the paper's runs)
	Type string  `mapstructure:"type"` // k1 | k2 | k3 (low_var_kl)
}

// KL-in-reward controllers.
const (
	KLControllerFixed    = "fixed"
	KLControllerAdaptive = "adaptive"
)

// AgentTrain (an agent's `train:`) overrides algorithm settings for one agent's share of the loss. Unset = the
// algorithm's value.
type AgentTrain struct {
	LR *float64 `mapstructure:"lr"` // only for an agent whose model no other agent uses
	// GradClip overrides models[].optim.grad_clip for the agent's model; like lr, only for an agent
	// whose model no other agent uses (a shared model takes one clipped step for all its agents).
	GradClip       *float64 `mapstructure:"grad_clip"`
	EntropyCoef    *float64 `mapstructure:"entropy_coef"`
	KLCoef         *float64 `mapstructure:"kl_coef"`
	ClipRatioLow   *float64 `mapstructure:"clip_ratio_low"`
	ClipRatioHigh  *float64 `mapstructure:"clip_ratio_high"`
	MicroBatchSize int      `mapstructure:"micro_batch_size"` // 0 = the algorithm's
}

// Defaults is the section `algorithm:` is decoded over.
func Defaults() Config {
	return Config{
		Normalization:     normalize.Spec{Preset: "drmas", Eps: 1e-6},
		GroupSize:         8,
		BatchSize:         16,
		PPOMiniUpdateNum:  1,
		PPOEpochs:         1,
		MicroBatchSize:    16,
		ClipRatioLow:      0.2,
		ClipRatioHigh:     0.2,
		ClipRatioC:        3.0,
		LossAggMode:       TokenMean,
		KL:                KL{Type: K3},
		MaxNonfiniteSteps: 10,
		Guard:             Guard{Window: 0, Factor: 5, Action: GuardLog},
		RolloutCorrection: Correction{Mode: CorrectionNone, Threshold: 2},
		KLInReward:        KLInReward{Type: K1, Controller: KLControllerFixed, Target: 0.1, Horizon: 10000},
		FilterGroups:      FilterGroups{MaxDraws: 4},
		RoutingReplay:     ReplayRollout,
	}
}

// Validate checks the section, each problem naming its key under key ("algorithm"); agents are the
// agents section's names, which per-agent estimator overrides must name.
func (a Config) Validate(key string, agents []string) error {
	var ck choice.Problems
	a.checkNormalization(&ck, key+".normalization", agents)
	g := a.Guard
	if g.Window != 0 {
		ck.IntIn(key+".guard.window", g.Window, 3, 1<<16)
	}
	if !(g.Factor > 1) || math.IsInf(g.Factor, 0) {
		ck.Bad(key+".guard.factor", "must be a finite number > 1 (got %g)", g.Factor)
	}
	ck.Registered(key+".guard.action", g.Action, GuardActions)
	rc := a.RolloutCorrection
	ck.Registered(key+".rollout_correction.mode", rc.Mode, RolloutCorrections)
	if !(rc.Threshold > 1) || math.IsInf(rc.Threshold, 0) {
		ck.Bad(key+".rollout_correction.threshold", "must be a finite number > 1 (got %g)", rc.Threshold)
	}
	for k, v := range map[string]int{"group_size": a.GroupSize, "batch_size": a.BatchSize,
		"ppo_mini_update_num": a.PPOMiniUpdateNum, "ppo_epochs": a.PPOEpochs, "micro_batch_size": a.MicroBatchSize,
		"max_nonfinite_steps": a.MaxNonfiniteSteps} {
		ck.IntIn(key+"."+k, v, 1, 1<<16)
	}
	ck.IntIn(key+".max_tokens_per_micro_batch", a.MaxTokensPerMicroBatch, 0, 1<<30)
	ck.Fraction(key+".clip_ratio_low", a.ClipRatioLow, false)
	ck.NonNeg(key+".clip_ratio_high", a.ClipRatioHigh)
	if !(a.ClipRatioC >= 1) || math.IsInf(a.ClipRatioC, 0) {
		ck.Bad(key+".clip_ratio_c", "must be a finite number ≥ 1, as in verl (1 = dual clip off; got %g)", a.ClipRatioC)
	}
	ck.Registered(key+".loss_agg_mode", a.LossAggMode, LossAggModes)
	ck.Registered(key+".routing_replay", a.RoutingReplay, RoutingReplays)
	ck.Registered(key+".kl.type", a.KL.Type, KLTypes)
	ck.NonNeg(key+".kl.coef", a.KL.Coef)
	ck.NonNeg(key+".entropy_coef", a.EntropyCoef)
	kr := a.KLInReward
	ck.IntIn(key+".filter_groups.max_draws", a.FilterGroups.MaxDraws, 1, 64)
	ck.NonNeg(key+".kl_in_reward.coef", kr.Coef)
	ck.Registered(key+".kl_in_reward.type", kr.Type, KLTypes)
	ck.OneOf(key+".kl_in_reward.controller", kr.Controller, []string{KLControllerFixed, KLControllerAdaptive})
	if kr.Controller == KLControllerAdaptive && kr.Coef > 0 {
		ck.Positive(key+".kl_in_reward.target", kr.Target)
		ck.Positive(key+".kl_in_reward.horizon", kr.Horizon)
	}
	return ck.Err()
}

// checkNormalization checks the estimator: the spec checks its own fields (normalize's rules, the
// ones drmas advantages applies), reported here by key; each per-agent override must name an agent
// of the agents section, once.
func (a Config) checkNormalization(ck *choice.Problems, key string, agents []string) {
	n := a.Normalization
	for _, e := range n.Check() {
		k := key
		if e.Field != "" {
			k += "." + e.Field
		}
		switch v, _ := e.Value.(string); {
		case e.Field == "":
			ck.Bad(k, "%s", e.Want)
		case e.Allowed != nil:
			ck.OneOf(k, v, e.Allowed)
		case e.Value == "":
			ck.Bad(k, "required (%s of the agents section)", e.Want)
		default:
			ck.Bad(k, "must be %s (got %v)", e.Want, e.Value)
		}
	}
	seen := map[string]bool{}
	for i, ag := range n.Agents {
		k := fmt.Sprintf("%s.agents[%d].name", key, i)
		switch {
		case ag.Name == "": // the spec's check reports it
		case !slices.Contains(agents, ag.Name):
			ck.Bad(k, "no agent %q in the agents section", ag.Name)
		case seen[ag.Name]:
			ck.Bad(k, "agent %q has a second override", ag.Name)
		}
		seen[ag.Name] = true
	}
}
