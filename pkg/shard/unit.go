package shard

import (
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// unit is one unit of a model whose weights are sharded (dist.shard: parameters): its tensors
// flattened in checkpoint order into n elements, zero-padded to per·N, and cut into N contiguous
// parts, part r held by rank r as its shard. While gathered, flat holds the whole unit and the
// model's tensors are views of it; while a backward accumulates into them, their gradients are views
// of grad. Released, the model's tensors (and their gradients) hold no data.
type unit struct {
	params []*ts.Tensor // the model's tensors (the same objects the model computes with)
	names  []string
	shapes [][]int64
	offs   []int64    // each tensor's first element in the flat unit
	n, per int64      // the flat unit's elements, and each rank's part: ⌈n/N⌉
	shard  *ts.Tensor // [per] this rank's part; a leaf that requires grad when the model trains
	flat   *ts.Tensor // [per·N] the whole unit while gathered, nil while released
	grad   *ts.Tensor // [per·N] the unit's gradients while a backward accumulates into them
	world  int        // N
	dtype  gotch.DType
	dev    gotch.Device
}

// cutUnit makes a unit of whole tensors: this rank's shard is copied out, and the tensors (and
// their gradients, left defined but empty for a trained unit) are released.
func cutUnit(ps []policy.Param, world, rank int, trained bool) *unit {
	u := &unit{world: world, dtype: ps[0].T.DType(), dev: ps[0].T.MustDevice()}
	for _, p := range ps {
		u.params, u.names = append(u.params, p.T), append(u.names, p.Name)
		u.shapes, u.offs = append(u.shapes, p.T.MustSize()), append(u.offs, u.n)
		u.n += int64(p.T.Numel())
	}
	u.per = (u.n + int64(world) - 1) / int64(world)
	_ = torch.Untracked(func() error {
		s := torch.NewScope()
		defer s.Close()
		return torch.NoGrad(func() error {
			flat := u.wholeFlat()
			u.shard = flat.MustNarrow(0, int64(rank)*u.per, u.per, false).MustDetachCopy(false)
			if trained {
				u.shard.MustRequiresGrad_(true)
			}
			s.Keep(u.shard)
			return nil
		})
	})
	if trained {
		emptyGrads(u.params)
	}
	u.release()
	return u
}

// wholeFlat is the unit's tensors, whole, as one flat [per·N] tensor (zero past n). Torch thread,
// in a scope.
func (u *unit) wholeFlat() *ts.Tensor {
	flat := ts.MustZeros([]int64{u.size()}, u.dtype, u.dev)
	for i, p := range u.params {
		flat.MustNarrow(0, u.offs[i], int64(p.Numel()), false).Copy_(p.MustDetach(false).MustReshape([]int64{-1}, true))
	}
	return flat
}

// size is the padded flat unit's elements, per·N.
func (u *unit) size() int64 { return u.per * int64(u.world) }

// emptyGrads gives each tensor a defined gradient holding no data: a gathered unit's gradients
// become views of its flat gradient buffer (openGrads), and only a defined gradient can. The
// gradient of 0·Σp defines a missing one.
func emptyGrads(params []*ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	var zero *ts.Tensor
	for _, p := range params {
		if p.MustGrad(false).MustDefined() {
			continue
		}
		z := p.MustSum(gotch.Double, false).MustMulScalar(ts.FloatScalar(0), true)
		if zero == nil {
			zero = z
		} else {
			zero = zero.MustAdd(z, true)
		}
	}
	if zero != nil {
		zero.MustBackward()
	}
	_ = torch.NoGrad(func() error {
		for _, p := range params {
			p.MustGrad(false).MustSet_()
		}
		return nil
	})
}

// setViews makes each tensor of ts a view of flat (its part of the flat unit); nil flat releases
// them (no data).
func (u *unit) setViews(ts_ []*ts.Tensor, flat *ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for i, t := range ts_ {
			if flat == nil {
				t.MustSet_()
				continue
			}
			n := int64(1)
			for _, d := range u.shapes[i] {
				n *= d
			}
			t.MustSetSourceTensor_(flat.MustNarrow(0, u.offs[i], n, false).MustView(u.shapes[i], true))
		}
		return nil
	})
}

// grads are the gradient tensors of the unit's weights (defined: see emptyGrads).
func (u *unit) grads() []*ts.Tensor {
	out := make([]*ts.Tensor, len(u.params))
	for i, p := range u.params {
		out[i] = p.MustGrad(false)
	}
	return out
}

// gather makes the unit whole: every rank's shard all-gathered into flat, the model's tensors
// views of it.
func (u *unit) gather(g *c10d.Group) error {
	if u.flat != nil {
		return fmt.Errorf("unit gathered twice")
	}
	flat, err := u.gatherFlat(g)
	if err != nil {
		return err
	}
	u.flat = flat
	u.setViews(u.params, flat)
	return nil
}

// gatherFlat all-gathers the shards into a new flat buffer (owned by the caller).
func (u *unit) gatherFlat(g *c10d.Group) (*ts.Tensor, error) {
	var flat *ts.Tensor
	err := torch.Untracked(func() error {
		flat = ts.MustEmpty([]int64{u.size()}, u.dtype, u.dev)
		src := u.shard.MustDetach(false)
		defer src.MustDrop()
		return g.AllGatherInto(flat, src)
	})
	if err != nil {
		flat.MustDrop()
		return nil, err
	}
	return flat, nil
}

// release lets the gathered weights go: the model's tensors hold no data again.
func (u *unit) release() {
	u.setViews(u.params, nil)
	if u.flat != nil {
		u.flat.MustDrop()
		u.flat = nil
	}
}

// openGrads gives the unit's weights zero gradients that are views of one flat buffer, for a
// backward to accumulate into.
func (u *unit) openGrads() {
	_ = torch.Untracked(func() error {
		u.grad = ts.MustZeros([]int64{u.size()}, u.dtype, u.dev)
		return nil
	})
	gs := u.grads()
	u.setViews(gs, u.grad)
	dropAll(gs)
}

// closeGrads frees the unit's gradient buffer, and any gradients autograd made its weights (a frozen
// base thawed for the format warm-up): the weights' gradients hold no data again.
func (u *unit) closeGrads() {
	gs := u.grads()
	defer dropAll(gs)
	_ = torch.NoGrad(func() error {
		for _, g := range gs {
			if g.MustDefined() && g.Numel() > 0 {
				g.MustSet_()
			}
		}
		return nil
	})
	if u.grad != nil {
		u.grad.MustDrop()
		u.grad = nil
	}
}

// reduce sums the unit's gradients over the ranks (zero where this rank has none open) and adds
// this rank's part of the sum to its shard's gradient: the reduce-scatter as the backward leaves
// the unit. The open gradients are freed.
func (u *unit) reduce(g *c10d.Group) error {
	return torch.Untracked(func() error {
		s := torch.NewScope()
		defer s.Close()
		buf := u.grad
		if buf == nil {
			buf = ts.MustZeros([]int64{u.size()}, u.dtype, u.dev)
		}
		mine, err := g.ReduceScatter(buf)
		if err == nil {
			err = torch.NoGrad(func() error {
				u.shard.MustGrad(false).MustAdd_(mine)
				return nil
			})
		}
		u.closeGrads()
		return err
	})
}

// idleGather takes part in another rank's gather of the unit (its result dropped).
func (u *unit) idleGather(g *c10d.Group) error {
	flat, err := u.gatherFlat(g)
	if err == nil {
		flat.MustDrop()
	}
	return err
}

// cut copies the gathered whole unit's part of this rank back into its shard (after the weights
// changed while whole: the format warm-up).
func (u *unit) cut(rank int) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		u.shard.Copy_(u.flat.MustNarrow(0, int64(rank)*u.per, u.per, false))
		return nil
	})
}

// dropAll frees the tensors (nil ones skipped).
func dropAll(ts []*ts.Tensor) {
	for _, t := range ts {
		if t != nil {
			t.MustDrop()
		}
	}
}
