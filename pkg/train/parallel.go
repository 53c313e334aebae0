package train

import (
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/optim"
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
//	reduce         a gradient summed over the ranks (all-reduce)
//	norm           the L2 norm of a complete gradient (dist.shard: gradients: from the partitions)
//	sum, max       figures summed (the iteration's loss terms and token counts) or maximized over the ranks
//	step           the optimizer step, after which every rank holds the same weights (sharded: each
//	               rank steps its partition and broadcasts it)
//	partition      which rank holds each of a model's parameters' optimizer state (nil: unsharded)
//	group          the process group (nil: one process)
//
// One process is single; data-parallel training over a c10d group is dataParallel (dist.go); with
// dist.shard it is sharded (shard.go: ZeRO-1/2).
type parallel interface {
	share(tasks int) (lo, hi int)
	gather(local *env.Rollout, lo int) (*env.Rollout, error)
	trainsOn(roll *env.Rollout) []bool
	exactShares() bool
	grads(model string, params []*ts.Tensor) (kept []*ts.Tensor, release func())
	reduce(params []*ts.Tensor) error
	norm(kept []*ts.Tensor) (float64, error)
	sum(v []float64) error
	max(v []float64) error
	step(model string, opt *optim.AdamW, params []*ts.Tensor) error
	partition(model string) *partition
	group() *c10d.Group
}

// newParallel is the strategy of a process group: single for one process (g nil or of size 1), else
// the strategy of the shard stage (dist.shard: dataParallel, or sharded partitioning the given
// models' parameters), training on the shares of dist.balance.
func newParallel(g *c10d.Group, d dist.Config, models map[string][]*ts.Tensor) parallel {
	if g.Size() == 1 {
		return single{}
	}
	dp := &dataParallel{g: g, approxNorms: d.AgentNorms == dist.NormsApprox, byTokens: d.Balance == dist.BalanceTokens}
	return shardStages[d.Shard](dp, models)
}

// shardStages builds the data-parallel strategy of each shard stage (dist.ShardStages: one
// implementation per registered name, checked at init).
var shardStages = map[string]func(dp *dataParallel, models map[string][]*ts.Tensor) parallel{
	dist.ShardNone:      func(dp *dataParallel, _ map[string][]*ts.Tensor) parallel { return dp },
	dist.ShardOptimizer: func(dp *dataParallel, m map[string][]*ts.Tensor) parallel { return newSharded(dp, false, m) },
	dist.ShardGradients: func(dp *dataParallel, m map[string][]*ts.Tensor) parallel { return newSharded(dp, true, m) },
}

// single is one process: it plays every task and trains on every call.
type single struct{}

func (single) share(tasks int) (int, int) { return 0, tasks }

func (single) gather(local *env.Rollout, _ int) (*env.Rollout, error) { return local, nil }

func (single) trainsOn(*env.Rollout) []bool { return nil }

func (single) exactShares() bool { return false }

func (single) grads(_ string, params []*ts.Tensor) ([]*ts.Tensor, func()) { return params, func() {} }

func (single) reduce([]*ts.Tensor) error { return nil }

func (single) norm(kept []*ts.Tensor) (float64, error) { return GradNorm(kept), nil }

func (single) sum([]float64) error { return nil }

func (single) max([]float64) error { return nil }

func (single) step(_ string, opt *optim.AdamW, _ []*ts.Tensor) error { return adamwStep(opt)() }

func (single) partition(string) *partition { return nil }

func (single) group() *c10d.Group { return nil }
