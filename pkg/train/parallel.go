package train

import (
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/shard"
)

// parallel is how an iteration's work is shared among data-parallel ranks: the collectives the step
// (step.go) calls where it needs the other ranks. A strategy never calls back into the step.
//
//	share, gather  which of the batch's tasks this rank plays, and the global rollout from the shares
//	trainsOn       which trajectories' calls this rank trains on (the others only count in the
//	               mini-batches' denominators)
//	exactShares    whether each agent's share of a gradient is completed on its own (dist.agent_norms:
//	               exact: one all-reduce per share, so the guard judges the global share)
//	grads          the gradients this rank keeps through a backward (dist.shard: gradients: its
//	               partition; the others are released again by the returned func)
//	reduce         a model's gradient summed over the ranks (all-reduce; under dist.shard: parameters
//	               reduced in the backward already)
//	norm           the L2 norm of a model's complete gradient (dist.shard: gradients, parameters: from
//	               the partitions)
//	sum, max       figures summed (the iteration's loss terms and token counts) or maximized over the ranks
//	step           the optimizer step, after which every rank holds the same weights (sharded: each
//	               rank steps its partition and broadcasts it)
//	partition      which rank holds (writes) each of a model's parameters' optimizer state (nil: unsharded)
//	group          the process group (nil: one process)
//
// and where the weights and the optimizer state live (weights). One process is single; data-parallel
// training over a c10d group is dataParallel (dist.go); with dist.shard it is sharded (shard.go:
// ZeRO-1/2) or fsdp (fsdp.go: parameters, ZeRO-3).
type parallel interface {
	share(tasks int) (lo, hi int)
	gather(local *env.Rollout, lo int) (*env.Rollout, error)
	trainsOn(roll *env.Rollout) []bool
	exactShares() bool
	grads(model string, params []*ts.Tensor) (kept []*ts.Tensor, release func())
	reduce(model string, params []*ts.Tensor) error
	norm(model string, kept []*ts.Tensor) (float64, error)
	sum(v []float64) error
	max(v []float64) error
	step(model string, opt *optim.AdamW, params []*ts.Tensor) error
	partition(model string) *shard.Partition
	group() *c10d.Group
	weights
}

// weights is where a strategy keeps the models' weights and optimizer state. Every stage but
// dist.shard: parameters keeps every model's whole weights on every rank (wholeWeights, whole.go);
// fsdp keeps shards of them (fsdp.go over pkg/shard's Weights):
//
//	state       the names and tensors that hold a trained model's state on this rank, which its
//	            optimizer steps (nil: its parameters)
//	sharded     whether this rank holds only a shard of a model's weights (the strategy keeps such
//	            weights alike across the ranks itself)
//	settle      meet the other ranks once each has finished its passes over sharded models (pkg/shard):
//	            before any collective outside the strategy, where ranks may have worked apart (torch
//	            thread; the strategy's own collectives settle first themselves)
//	whole       run fn with every model whole on every rank (the format warm-up), then every rank
//	            takes rank 0's weights
//	reference   a frozen copy of a model's current weights, held as the model's are (a KL reference)
//	adopt       hold a whole model just loaded as the strategy holds weights (a KL reference read
//	            back; under parameters every model, as the team loads)
//	writeOptim  write this rank's file of a model's optimizer state into a checkpoint (a collective
//	            under parameters: the whole tensors of the parameters it owns, gathered unit by unit)
//	restore     read this rank's optimizer state back from a checkpoint's model folder (any world
//	            size and stage)
type weights interface {
	state(model string) (names []string, tensors []*ts.Tensor)
	sharded(model string) bool
	settle() error
	whole(fn func() error) error
	reference(model string, m *policy.Model) (*policy.Model, error)
	adopt(id string, m *policy.Model, trained bool) error
	writeOptim(model string, opt *optim.AdamW, path string, meta map[string]string) error
	restore(model string, opt *optim.AdamW, dir string) error
}

// newParallel is the strategy of a process group: single for one process (g nil or of size 1), else
// the strategy of the shard stage (dist.shard: dataParallel, sharded partitioning the given trained
// models' parameters, or fsdp over the sharded weights w), training on the shares of dist.balance.
func newParallel(g *c10d.Group, d dist.Config, models map[string][]*ts.Tensor, w *shard.Weights) parallel {
	if g.Size() == 1 {
		return single{}
	}
	dp := &dataParallel{g: g, approxNorms: d.AgentNorms == dist.NormsApprox, byTokens: d.Balance == dist.BalanceTokens}
	return shardStages[d.Shard](dp, models, w)
}

// shardStages builds the data-parallel strategy of each shard stage (dist.ShardStages: one
// implementation per registered name, checked at init).
var shardStages = map[string]func(dp *dataParallel, m map[string][]*ts.Tensor, w *shard.Weights) parallel{
	dist.ShardNone: func(dp *dataParallel, _ map[string][]*ts.Tensor, _ *shard.Weights) parallel { return dp },
	dist.ShardOptimizer: func(dp *dataParallel, m map[string][]*ts.Tensor, _ *shard.Weights) parallel {
		return newSharded(dp, false, m)
	},
	dist.ShardGradients: func(dp *dataParallel, m map[string][]*ts.Tensor, _ *shard.Weights) parallel {
		return newSharded(dp, true, m)
	},
	dist.ShardParameters: func(dp *dataParallel, _ map[string][]*ts.Tensor, w *shard.Weights) parallel { return &fsdp{dp, w} },
}

// single is one process: it plays every task and trains on every call.
type single struct{ wholeWeights }

func (single) share(tasks int) (int, int) { return 0, tasks }

func (single) gather(local *env.Rollout, _ int) (*env.Rollout, error) { return local, nil }

func (single) trainsOn(*env.Rollout) []bool { return nil }

func (single) exactShares() bool { return false }

func (single) grads(_ string, params []*ts.Tensor) ([]*ts.Tensor, func()) { return params, func() {} }

func (single) reduce(string, []*ts.Tensor) error { return nil }

func (single) norm(_ string, kept []*ts.Tensor) (float64, error) { return GradNorm(kept), nil }

func (single) sum([]float64) error { return nil }

func (single) max([]float64) error { return nil }

func (single) step(_ string, opt *optim.AdamW, _ []*ts.Tensor) error { return adamwStep(opt)() }

func (single) partition(string) *shard.Partition { return nil }

func (single) group() *c10d.Group { return nil }
