package train

import (
	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/team"

	"fmt"
	"sort"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/microbatch"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/shard"
)

// modelState is one model group: the weights, their optimizer, and the agents that train them with
// the loss each of them is trained on.
type modelState struct {
	id      string
	cfg     model.Config
	pol     *policy.Policy
	ref     *policy.Policy // frozen reference for the KL penalty (nil when off)
	names   []string
	params  []*ts.Tensor
	opt     *optim.AdamW // nil where no step is taken (the counterfactual inspection)
	agents  []string     // sorted
	loss    objective
	horizon float64 // max_new_tokens over its agents (seq-mean-token-sum-norm)
	streak  int     // non-finite steps in a row

	guard *guard // the per-agent gradient guard; nil when off

	moe *routing // a mixture-of-experts model's routing in training (nil: dense)

	upd updates  // how the iteration's calls become optimizer steps
	par parallel // how the work is shared among data-parallel ranks (single: one process)
}

// updates are the resolved numbers of a model group's update: ppo_epochs passes over the iteration's
// calls, each of ppo_mini_update_num optimizer steps on mini-batches drawn in an order seeded by the
// run's seed and the model id; the gradient clip; the bound on non-finite steps in a row; whether
// the forward recomputes each layer in backward (gradient checkpointing).
type updates struct {
	epochs, miniBatches int
	seed                uint64
	gradClip            float64
	maxNonfinite        int
	checkpointing       bool
}

// objective is what a model group's loss is made of: verl's clipped policy gradient with the
// algorithm's settings, and per agent the coefficients in force for that agent's calls.
type objective struct {
	aggMode    string  // loss_agg_mode
	clipC      float64 // dual clip
	klType     string
	microBatch int // sequences per forward/backward where no agent override applies
	// maxTokens > 0: micro-batches by padded tokens instead of by count (the model's
	// max_tokens_per_micro_batch, else the algorithm's; pkg/microbatch)
	maxTokens  int
	agents     map[string]agentCoefs
	correction string  // algorithm.rollout_correction.mode
	corrC      float64 // its threshold C
	// balance: each call's pg loss is weighted by its item's lw (algorithm.balance_loss_by_agent_freq).
	balance bool
	// klReward: the model's calls carry a KL penalty in their scores, so it needs a reference.
	klReward bool
}

// agentCoefs are the loss coefficients in force for one agent's calls.
type agentCoefs struct {
	clipLow, clipHigh, entropy, kl float64
	microBatch                     int
	// behaviourKnown: the generator's log-probs of the agent's tokens are the behaviour policy's
	// (sampled at temperature 1), so the off-policy correction applies to them.
	behaviourKnown bool
}

// newModels gathers the model groups of a config over its policies, sorted by id.
func newModels(c *config.Config, router policy.Router, seed int64) []*modelState {
	var out []*modelState
	for _, mc := range c.Models {
		if c.IsFrozenBase(mc.ID) { // frozen: no gradients, no optimizer; its adapters are the groups
			continue
		}
		out = append(out, newModelState(c.Algorithm, c.Agents, mc, router[mc.ID], seed))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// newModelState gathers a model group: its policy's parameters, its agents (sorted) with their loss
// coefficients, and their response horizon. It has no optimizer yet.
func newModelState(al algo.Config, agents []team.Agent, mc model.Config, pol *policy.Policy, seed int64) *modelState {
	ms := &modelState{id: mc.ID, cfg: mc, pol: pol, loss: objective{aggMode: al.LossAggMode, clipC: al.ClipRatioC,
		klType: al.KL.Type, microBatch: al.MicroBatchSize, maxTokens: al.MaxTokensPerMicroBatch, agents: map[string]agentCoefs{},
		correction: al.RolloutCorrection.Mode, corrC: al.RolloutCorrection.Threshold,
		balance: al.BalanceLossByAgentFreq, klReward: al.KLInReward.Coef > 0}, guard: newGuard(al.Guard),
		upd: updates{epochs: al.PPOEpochs, miniBatches: al.PPOMiniUpdateNum, seed: uint64(seed) ^ hashString(mc.ID),
			gradClip: mc.Optim.GradClip, maxNonfinite: al.MaxNonfiniteSteps, checkpointing: mc.GradientCheckpointing},
		par: single{}}
	for _, a := range agents {
		if a.Model == mc.ID {
			ms.agents = append(ms.agents, a.Name)
			c := coefs(al, a.Train)
			c.behaviourKnown = a.Sampling.Resolve().Temperature == 1
			ms.loss.agents[a.Name] = c
			ms.horizon = max(ms.horizon, float64(a.Sampling.Resolve().MaxNewTokens))
			if a.Train.GradClip != nil { // the model's only agent (validated)
				ms.upd.gradClip = *a.Train.GradClip
			}
		}
	}
	if mc.MaxTokensPerMicroBatch > 0 {
		ms.loss.maxTokens = mc.MaxTokensPerMicroBatch
	}
	sort.Strings(ms.agents)
	ms.names, ms.params = policy.SplitParams(pol.Model.Parameters())
	ms.moe = newRouting(pol.Model, al.RoutingReplay)
	return ms
}

// coefs are the algorithm's loss coefficients with an agent's overrides applied.
func coefs(al algo.Config, tr algo.AgentTrain) agentCoefs {
	c := agentCoefs{clipLow: al.ClipRatioLow, clipHigh: al.ClipRatioHigh, entropy: al.EntropyCoef, kl: al.KL.Coef, microBatch: al.MicroBatchSize}
	if tr.ClipRatioLow != nil {
		c.clipLow = *tr.ClipRatioLow
	}
	if tr.ClipRatioHigh != nil {
		c.clipHigh = *tr.ClipRatioHigh
	}
	if tr.EntropyCoef != nil {
		c.entropy = *tr.EntropyCoef
	}
	if tr.KLCoef != nil {
		c.kl = *tr.KLCoef
	}
	if tr.MicroBatchSize > 0 {
		c.microBatch = tr.MicroBatchSize
	}
	return c
}

// microBatches cuts calls into the micro-batches of one forward/backward each: by the model's token
// budget when it has one, else count calls each in their order (pkg/microbatch).
func (o objective) microBatches(xs []*item, count int) [][]*item {
	lengths := make([]int, len(xs))
	for i, x := range xs {
		lengths[i] = len(x.prompt) + len(x.response)
	}
	var out [][]*item
	for _, idx := range microbatch.Split(lengths, count, o.maxTokens) {
		mb := make([]*item, len(idx))
		for j, i := range idx {
			mb[j] = xs[i]
		}
		out = append(out, mb)
	}
	return out
}

// newOptimizer creates the model's AdamW from models[].optim, over the parameters of part this rank
// holds (nil: all); an agent that has the model to itself may set its own learning rate
// (agents[].train.lr). Torch thread.
func (ms *modelState) newOptimizer(agents []team.Agent, part *shard.Partition) *optim.AdamW {
	o := ms.cfg.Optim
	opt := optim.AdamWOptions{LR: o.LR, Beta1: o.Betas[0], Beta2: o.Betas[1], Eps: o.Eps, WeightDecay: o.WeightDecay, WarmupSteps: o.WarmupSteps,
		Offload: o.Offload == algo.OffloadCPU}
	if len(ms.agents) == 1 {
		for _, a := range agents {
			if a.Name == ms.agents[0] && a.Train.LR != nil {
				opt.LR = *a.Train.LR
			}
		}
	}
	names, params := part.Mine(ms.names, ms.params) // sharded: this rank's partition only
	return optim.NewAdamW(names, params, opt)
}

// usesKL says whether any of the model's agents has a KL penalty, in the loss or in the reward (so
// the model needs a reference).
func (ms *modelState) usesKL() bool {
	if ms.loss.klReward {
		return true
	}
	for _, c := range ms.loss.agents {
		if c.kl > 0 {
			return true
		}
	}
	return false
}

// makeReference freezes a copy of the model's current weights as its KL reference (held as the
// model's weights are: sharded under dist.shard parameters).
func (ms *modelState) makeReference() error {
	ref, err := ms.par.reference(ms.id, ms.pol.Model)
	if err != nil {
		return fmt.Errorf("model %s: KL reference: %w", ms.id, err)
	}
	ms.ref, err = policy.NewPolicy(ms.id+"-ref", ref, ms.pol.Tok, ms.pol.Chat)
	return err
}

// anyKL says whether any model's agents use a KL penalty.
func anyKL(models []*modelState) bool {
	for _, ms := range models {
		if ms.usesKL() {
			return true
		}
	}
	return false
}
