package train

import (
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/env"
)

// parallel is how an iteration's work is shared among data-parallel ranks, as the step sees it: four
// named calls, at the points where the step needs the other ranks.
//
//	rollout   which of the batch's tasks this rank plays, and the global rollout from the ranks' shares
//	assign    which of the rollout's calls this rank trains on (the others only count in the
//	          mini-batches' denominators)
//	backward  a mini-batch's complete gradient (summed over the ranks), each agent's share of it
//	          measured and judged by the guard
//	reduce    a model's loss terms and token counts of the iteration, summed over the ranks
//	gradNorm  the pre-clip norm of the complete gradient (sharded: from the ranks' partitions)
//	step      the optimizer step, after which every rank holds the same weights (sharded: each rank
//	          steps its partition and broadcasts it)
//
// One process is single (every call does the work alone); data-parallel training over a c10d group
// is dataParallel (dist.go); with dist.shard it is sharded (shard.go: ZeRO-1/2, each rank holding and
// updating its partition of the optimizer state, and under gradients of the reduced gradients).
type parallel interface {
	rollout(tasks int, play func(lo, hi int) (*env.Rollout, error)) (*env.Rollout, error)
	assign(perModel map[string][]*item, roll *env.Rollout)
	backward(ms *modelState, mb miniBatch) (stepStats, error)
	reduce(s *modelStats) error
	gradNorm(ms *modelState) (float64, error)
	step(ms *modelState) error
}

// newParallel is the strategy of a process group: single for one process (g nil or of size 1),
// sharded for dist.shard optimizer or gradients, else dataParallel.
func newParallel(g *dist.Group, approxNorms bool, shard string) parallel {
	if g.Size() == 1 {
		return single{}
	}
	dp := &dataParallel{group: g, approxNorms: approxNorms}
	if shard == ShardOptimizer || shard == ShardGradients {
		return &sharded{dataParallel: dp, grads: shard == ShardGradients}
	}
	return dp
}

// single is one process: it plays every task and trains on every call.
type single struct{}

func (single) rollout(tasks int, play func(lo, hi int) (*env.Rollout, error)) (*env.Rollout, error) {
	return play(0, tasks)
}

func (single) assign(map[string][]*item, *env.Rollout) {}

func (single) backward(ms *modelState, mb miniBatch) (stepStats, error) { return ms.backward(mb) }

func (single) reduce(*modelStats) error { return nil }

func (single) gradNorm(ms *modelState) (float64, error) { return GradNorm(ms.params), nil }

func (single) step(ms *modelState) error { return adamwStep(ms.opt)() }
