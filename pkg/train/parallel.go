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
//
// One process is single (every call does the work alone); data-parallel training over a c10d group
// is dataParallel (dist.go). Sharding the optimizer state (ZeRO-1/2) is a further implementation:
// backward ending in a reduce-scatter, with each rank updating its partition.
type parallel interface {
	rollout(tasks int, play func(lo, hi int) (*env.Rollout, error)) (*env.Rollout, error)
	assign(perModel map[string][]*item, roll *env.Rollout)
	backward(ms *modelState, mb miniBatch) (stepStats, error)
	reduce(s *modelStats) error
}

// newParallel is the strategy of a process group: single for one process (g nil or of size 1).
func newParallel(g *dist.Group, approxNorms bool) parallel {
	if g.Size() == 1 {
		return single{}
	}
	return &dataParallel{group: g, approxNorms: approxNorms}
}

// single is one process: it plays every task and trains on every call.
type single struct{}

func (single) rollout(tasks int, play func(lo, hi int) (*env.Rollout, error)) (*env.Rollout, error) {
	return play(0, tasks)
}

func (single) assign(map[string][]*item, *env.Rollout) {}

func (single) backward(ms *modelState, mb miniBatch) (stepStats, error) { return ms.backward(mb) }

func (single) reduce(*modelStats) error { return nil }
