package train

// Sharded data-parallel training (dist.shard; docs/scale-out.md), ZeRO-1 and ZeRO-2 over the
// c10d group of dataParallel:
//
//	optimizer   each rank owns a partition of every model's parameters (whole parameters, balanced by
//	            element count) and holds the float32 master weights and AdamW moments of those only.
//	            The gradients are all-reduced as in plain data parallelism; each rank steps its own
//	            partition; every owner then broadcasts its updated weights, so that all ranks hold
//	            the same weights for the next forward, rollout and engine sync.
//	gradients   in addition, each rank keeps only its partition's reduced gradients: right after the
//	            all-reduce the others are released (their storage freed) until the next backward,
//	            and the exact-share accumulator (dist.agent_norms: exact) holds the partition only.
//	            Libtorch 1.13's Gloo has no reduce_scatter, so the reduction is the all-reduce of
//	            plain data parallelism followed by dropping what the rank does not own: the same
//	            traffic as none; what it saves is memory between backward passes, not during them.
//
// Every norm the step needs — the pre-clip total, each agent's share (shared models too), the guard's
// inputs, the non-finite test and so the clip factor — is computed under `gradients` from the ranks'
// partitions: the sum of squares over the owned gradients, then one all-reduce of that one number
// (a NaN or Inf anywhere reaches every rank). The values equal the unsharded ones up to the order of
// the float64 summation; every rank takes the same decisions since they all hold the reduced sum.
//
// Communication per optimizer step, P parameters of b bytes (gradients in the parameters' dtype):
// none: an all-reduce of P·b; optimizer and gradients: the same all-reduce plus a broadcast of each
// owner's updated weights (P·b leave their owners in all), plus under gradients one all-reduce of
// one float64 per norm.

import (
	"fmt"
	"math"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/shard"
	"github.com/drmas/drmas/pkg/torch"
)

// sharded is dataParallel with the optimizer state (and, under gradients, the gradients between
// steps) partitioned among the ranks: the partition of each model's parameters lives here.
type sharded struct {
	*dataParallel
	gradsToo bool // dist.shard: gradients
	parts    map[string]*shard.Partition
}

// newSharded partitions each model's parameters among the group's ranks.
func newSharded(dp *dataParallel, gradsToo bool, models map[string][]*ts.Tensor) *sharded {
	p := &sharded{dataParallel: dp, gradsToo: gradsToo, parts: map[string]*shard.Partition{}}
	for id, params := range models {
		p.parts[id] = shard.PartitionOf(params, dp.g.Size(), dp.g.Rank())
	}
	return p
}

func (p *sharded) partition(model string) *shard.Partition { return p.parts[model] }

// grads under gradients gives the released gradients their shapes back for autograd and keeps the
// owned ones; release frees the others again. Under optimizer every gradient is kept.
func (p *sharded) grads(model string, params []*ts.Tensor) ([]*ts.Tensor, func()) {
	if !p.gradsToo {
		return params, func() {}
	}
	part := p.parts[model]
	restoreGrads(params, part)
	var owned []*ts.Tensor
	for i, t := range params {
		if part.Owns(i) {
			owned = append(owned, t)
		}
	}
	return owned, func() { releaseGrads(params, part) }
}

// norm is the pre-clip norm: under gradients from the partitions, else from the whole reduced
// gradient every rank holds.
func (p *sharded) norm(_ string, kept []*ts.Tensor) (float64, error) {
	if !p.gradsToo {
		return GradNorm(kept), nil
	}
	return partNorm(p.g, kept)
}

// partNorm is the L2 norm of a gradient partitioned among the ranks: each rank's sum of squares over
// the parameters (or shards) it owns, summed by one all-reduce of a single float64.
func partNorm(g *c10d.Group, owned []*ts.Tensor) (float64, error) {
	v := []float64{gradSquares(owned)}
	if err := g.AllReduceFloats(v, c10d.Sum); err != nil {
		return 0, err
	}
	return math.Sqrt(v[0]), nil
}

// step takes the AdamW step on this rank's partition, then every rank broadcasts the weights it
// updated, so that all ranks hold the same weights.
func (p *sharded) step(model string, opt *optim.AdamW, params []*ts.Tensor) error {
	if err := adamwStep(opt)(); err != nil {
		return err
	}
	return broadcastOwned(p.g, params, p.parts[model])
}

// broadcastOwned sends each rank's parameters to the others: one broadcast per rank, of its
// parameters flattened into one buffer.
func broadcastOwned(g *c10d.Group, params []*ts.Tensor, part *shard.Partition) error {
	s := torch.NewScope()
	defer s.Close()
	return torch.NoGrad(func() error {
		for r := 0; r < part.World; r++ {
			var mine []*ts.Tensor
			var n int64
			for i, t := range params {
				if part.Owner[i] == r {
					mine = append(mine, t)
					n += int64(t.Numel())
				}
			}
			if n == 0 {
				continue
			}
			var buf *ts.Tensor
			if r == part.Rank {
				flat := make([]*ts.Tensor, len(mine))
				for i, t := range mine {
					flat[i] = t.MustView([]int64{-1}, false)
				}
				buf = ts.MustCat(flat, 0)
			} else {
				buf = ts.MustEmpty([]int64{n}, mine[0].DType(), mine[0].MustDevice())
			}
			if err := g.Broadcast([]*ts.Tensor{buf}, r); err != nil {
				return fmt.Errorf("broadcasting rank %d's updated weights: %w", r, err)
			}
			if r == part.Rank {
				continue
			}
			off := int64(0)
			for _, t := range mine {
				k := int64(t.Numel())
				t.Copy_(buf.MustNarrow(0, off, k, false).MustView(t.MustSize(), true))
				off += k
			}
		}
		return nil
	})
}

// releaseGrads frees the storage of the gradients of the parameters this rank does not own (they
// become empty tensors; restoreGrads gives them back their shapes before the next backward).
func releaseGrads(params []*ts.Tensor, part *shard.Partition) {
	forOthersGrads(params, part, func(p, g *ts.Tensor) {
		if g.Numel() > 0 {
			g.MustSet_()
		}
	})
}

// restoreGrads gives released gradients their parameters' shapes again, zeroed.
func restoreGrads(params []*ts.Tensor, part *shard.Partition) {
	forOthersGrads(params, part, func(p, g *ts.Tensor) {
		if g.Numel() != p.Numel() {
			g.MustResize_(p.MustSize())
			g.MustZero_()
		}
	})
}

// forOthersGrads calls fn with each parameter this rank does not own and its defined gradient.
func forOthersGrads(params []*ts.Tensor, part *shard.Partition, fn func(p, g *ts.Tensor)) {
	if part == nil {
		return
	}
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for i, p := range params {
			if part.Owns(i) {
				continue
			}
			if g := p.MustGrad(false); g.MustDefined() {
				fn(p, g)
			}
		}
		return nil
	})
}

// heldGradElements counts the gradient elements a model holds now (released ones count zero).
func heldGradElements(params []*ts.Tensor) int64 {
	s := torch.NewScope()
	defer s.Close()
	var n int64
	for _, p := range params {
		if g := p.MustGrad(false); g.MustDefined() {
			n += int64(g.Numel())
		}
	}
	return n
}
