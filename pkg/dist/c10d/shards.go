package c10d

import (
	"fmt"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist"
)

// The collectives of parameter sharding (dist.shard: parameters; pkg/shard): a unit of
// weights is one flat buffer of Size()·n elements, rank r holding [r·n, (r+1)·n).
//
// On NCCL they are libtorch's flat collectives (all_gather_into_tensor, reduce_scatter_tensor: the
// shim's drmas_all_gather_base and drmas_reduce_scatter_base). Debian's libtorch 1.13 Gloo has
// neither, so on Gloo they are emulated with what it has: AllGatherInto is the list all-gather with
// its outputs as views of the flat buffer (the parts land in place), ReduceScatter an all-reduce of
// the whole buffer of which each rank keeps its part (twice a true reduce-scatter's traffic:
// 2·(N−1)/N of the buffer per rank instead of (N−1)/N).

// AllGatherInto gathers every rank's shard into flat, in rank order: flat has Size() × shard's
// elements, of shard's dtype, contiguous, on the backend's device; rank r's shard lands at
// [r·n, (r+1)·n).
func (g *Group) AllGatherInto(flat, shard *ts.Tensor) error {
	n := shard.Numel()
	if flat.Numel() != n*uint(g.Size()) {
		return fmt.Errorf("dist: all-gather of %d elements per rank into %d (%d ranks)", n, flat.Numel(), g.Size())
	}
	if g == nil {
		flat.Copy_(shard)
		return nil
	}
	if g.opt.Backend == dist.BackendNCCL {
		return g.call("all-gather into a flat buffer", func() error { return g.pg.AllGatherBase(flat.Ctensor(), shard.Ctensor()) })
	}
	outs := make([]*ts.Tensor, g.Size())
	for r := range outs {
		outs[r] = flat.MustNarrow(0, int64(r)*int64(n), int64(n), false)
	}
	defer func() {
		for _, o := range outs {
			o.MustDrop()
		}
	}()
	return g.call("all-gather", func() error { return g.pg.AllGather(handles(outs), shard.Ctensor()) })
}

// ReduceScatter sums flat (Size()·n elements, contiguous) over the ranks and returns this rank's
// part of the sum, [r·n, (r+1)·n), as a view of flat: on NCCL written there by a reduce-scatter (the
// rest of flat is left as it was), on Gloo by an all-reduce (see above: flat holds the whole sum).
func (g *Group) ReduceScatter(flat *ts.Tensor) (*ts.Tensor, error) {
	w := uint(g.Size())
	if flat.Numel()%w != 0 {
		return nil, fmt.Errorf("dist: reduce-scatter of %d elements over %d ranks", flat.Numel(), w)
	}
	n := int64(flat.Numel() / w)
	mine := flat.MustNarrow(0, int64(g.Rank())*n, n, false)
	if g != nil && g.opt.Backend == dist.BackendNCCL {
		// Into a buffer of its own: NCCL's output must not overlap its input.
		out := mine.MustZerosLike(false)
		defer out.MustDrop()
		if err := g.call("reduce-scatter", func() error { return g.pg.ReduceScatterBase(out.Ctensor(), flat.Ctensor(), int(Sum)) }); err != nil {
			mine.MustDrop()
			return nil, err
		}
		mine.Copy_(out)
		return mine, nil
	}
	if g != nil {
		err := g.call("reduce-scatter", func() error { return g.pg.AllReduce(handles([]*ts.Tensor{flat}), int(Sum)) })
		if err != nil {
			mine.MustDrop()
			return nil, err
		}
	}
	return mine, nil
}
