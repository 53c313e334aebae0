package train

import (
	"fmt"
	"path/filepath"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
)

// The optimizer state of a sharded model in a checkpoint (dist.shard: parameters) keeps the format
// of the other sharded stages (optimstate.go): whole tensors per parameter (exp_avg.<name>,
// exp_avg_sq.<name>, master.<name> for half dtypes), each in the file of the rank that owns the
// parameter by the partition of whole parameters, and optim.index.json. Each rank's AdamW holds flat
// shards instead, which cut across parameters: writing gathers each unit's state and keeps the
// parameters this rank owns, one unit at a time; reading copies the part of each whole tensor that
// falls in this rank's shards. So a checkpoint written under parameters resumes under any stage and
// world size, and any checkpoint resumes under parameters.

// optimKinds are the optimizer's tensors per parameter, as checkpoints name them.
var optimKinds = []string{"exp_avg.", "exp_avg_sq.", "master."}

// stateOf is the optimizer tensor of kind k (optimKinds) for shard i; nil when the optimizer keeps
// none in checkpoints (the master copy of a float32 parameter).
func stateOf(opt *optim.AdamW, k, i int) *ts.Tensor {
	switch k {
	case 0:
		return opt.M[i]
	case 1:
		return opt.V[i]
	}
	if opt.SavedMaster(i) {
		return opt.Master[i]
	}
	return nil
}

// optimState gathers a sharded model's optimizer state unit by unit and returns the whole tensors of
// the parameters this rank owns (partition); free releases them. A collective: every rank calls it
// for the same models in the same order. An adapter's (replicated) state is its own.
func (w *shardedWeights) optimState(model string, opt *optim.AdamW) ([]string, []*ts.Tensor, func(), error) {
	um := w.models[model]
	if um == nil || !um.trained {
		return wholeWeights{}.optimState(model, opt)
	}
	owner := map[string]int{}
	names, _ := policy.SplitParams(um.m.Parameters())
	for i, n := range names {
		owner[n] = w.parts[model].owner[i]
	}
	var outNames []string
	var out []*ts.Tensor
	free := func() { dropAll(out) }
	err := torch.Untracked(func() error {
		for i, u := range um.units {
			for k, prefix := range optimKinds {
				src := stateOf(opt, k, i)
				if src == nil {
					continue
				}
				got, err := u.gatherState(w.g, src, func(j int) bool { return owner[u.names[j]] == w.g.Rank() })
				if err != nil {
					return err
				}
				for j, t := range got {
					if t != nil {
						outNames, out = append(outNames, prefix+u.names[j]), append(out, t)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		free()
		return nil, nil, nil, err
	}
	return outNames, out, free, nil
}

// gatherState all-gathers one optimizer tensor of the unit's shards (float32, [per]) and returns
// copies of the whole tensors of the parameters keep selects (nil for the others), shaped as the
// parameters. Untracked: the caller owns them.
func (u *unit) gatherState(g *c10d.Group, src *ts.Tensor, keep func(j int) bool) ([]*ts.Tensor, error) {
	s := torch.NewScope()
	defer s.Close()
	flat := ts.MustEmpty([]int64{u.size()}, gotch.Float, u.dev)
	if err := g.AllGatherInto(flat, src.MustTo(u.dev, false)); err != nil {
		return nil, err
	}
	out := make([]*ts.Tensor, len(u.names))
	for j := range u.names {
		if !keep(j) {
			continue
		}
		out[j] = flat.MustNarrow(0, u.offs[j], numel(u.shapes[j]), false).MustView(u.shapes[j], true).MustContiguous(false).MustDetachCopy(false)
		s.Keep(out[j])
	}
	return out, nil
}

// numel is the number of elements of a shape.
func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// restore reads a sharded model's optimizer state from a checkpoint's model folder, whatever stage
// and world size wrote it: the part of each whole tensor that lies in this rank's shards. An
// adapter's is read whole. Torch thread.
func (w *shardedWeights) restore(model string, opt *optim.AdamW, dir string) error {
	um := w.models[model]
	if um == nil || !um.trained {
		return wholeWeights{}.restore(model, opt, dir)
	}
	idx, sharded, err := rundir.ReadOptimIndex(dir)
	if err != nil {
		return err
	}
	if err := loadOptimStep(opt, dir); err != nil {
		return err
	}
	file := func(name string) (string, error) {
		if !sharded {
			return filepath.Join(dir, "optim.safetensors"), nil
		}
		f, ok := idx.WeightMap[name]
		if !ok {
			return "", fmt.Errorf("%s: no tensor %s (written by %d rank(s) with dist.shard %s)", filepath.Join(dir, rundir.OptimIndexFile), name, idx.WorldSize, idx.Shard)
		}
		return filepath.Join(dir, f), nil
	}
	for i, u := range um.units {
		for j := range u.names {
			if err := u.restoreParam(opt, i, j, w.g.Rank(), file); err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreParam copies the part of parameter j's optimizer tensors that lies in this rank's shard of
// the unit (the optimizer's tensors of shard i) from the checkpoint's whole tensors.
func (u *unit) restoreParam(opt *optim.AdamW, i, j, rank int, file func(string) (string, error)) error {
	lo, hi := int64(rank)*u.per, int64(rank+1)*u.per
	a, b := u.offs[j], u.offs[j]+numel(u.shapes[j])
	from, to := max(a, lo), min(b, hi)
	if from >= to {
		return nil
	}
	s := torch.NewScope()
	defer s.Close()
	for k, prefix := range optimKinds {
		dst := stateOf(opt, k, i)
		if dst == nil {
			continue
		}
		name := prefix + u.names[j]
		path, err := file(name)
		if err != nil {
			return err
		}
		whole := ts.MustZeros(u.shapes[j], gotch.Float, gotch.CPU)
		if err := policy.LoadTensorsInto(path, []string{name}, []*ts.Tensor{whole}); err != nil {
			return err
		}
		part := whole.MustReshape([]int64{-1}, false).MustNarrow(0, from-a, to-from, false)
		_ = torch.NoGrad(func() error {
			dst.MustNarrow(0, from-lo, to-from, false).Copy_(part)
			return nil
		})
	}
	return nil
}
