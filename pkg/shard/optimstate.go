package shard

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
// of the other sharded stages (pkg/train/optimstate.go): whole tensors per parameter (exp_avg.<name>,
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

// WriteOptim writes this rank's file of a trained sharded model's optimizer state (Trains): the
// whole tensors of the parameters it owns (Partition), streamed unit by unit — every rank gathers
// each unit's state in turn (a collective) and writes the part it owns as it comes, so no rank holds
// more than one unit's state besides its own shards. Torch thread.
func (w *Weights) WriteOptim(model string, opt *optim.AdamW, path string, meta map[string]string) error {
	if !w.Trains(model) {
		return fmt.Errorf("model %s: no sharded trained weights here", model)
	}
	um := w.models[model]
	names, _ := policy.SplitParams(um.m.Parameters())
	owner := map[string]int{}
	for i, n := range names {
		owner[n] = w.parts[model].Owner[i]
	}
	st := &stateStream{g: w.g, um: um, opt: opt}
	var specs []policy.TensorSpec
	for i, u := range um.units {
		for k, prefix := range optimKinds {
			if stateOf(opt, k, i) == nil {
				continue
			}
			st.steps = append(st.steps, [2]int{i, k})
			for j, n := range u.names {
				if owner[n] == w.g.Rank() {
					specs = append(specs, policy.TensorSpec{Name: prefix + n, DType: gotch.Float, Shape: u.shapes[j]})
					st.at = append(st.at, stateAt{step: len(st.steps) - 1, param: j})
				}
			}
		}
	}
	err := policy.StreamTensors(path, specs, st.next, meta)
	if ferr := st.finish(); err == nil { // the rest of the units, in step with the other ranks
		err = ferr
	}
	st.drop()
	return err
}

// stateStream gathers a sharded model's optimizer state one (unit, kind) at a time, in the same order
// on every rank, for WriteOptim.
type stateStream struct {
	g     *c10d.Group
	um    *unitModel
	opt   *optim.AdamW
	steps [][2]int   // (unit, kind) in order
	at    []stateAt  // each tensor written: its step and its parameter in the unit
	done  int        // steps gathered
	flat  *ts.Tensor // the last step's gathered state
}

type stateAt struct{ step, param int }

// advance gathers the steps up to and including n.
func (st *stateStream) advance(n int) error {
	for st.done <= n {
		st.drop()
		i, k := st.steps[st.done][0], st.steps[st.done][1]
		u := st.um.units[i]
		err := torch.Untracked(func() error {
			st.flat = ts.MustEmpty([]int64{u.size()}, gotch.Float, u.dev)
			src := stateOf(st.opt, k, i).MustTo(u.dev, false)
			defer src.MustDrop()
			return st.g.AllGatherInto(st.flat, src)
		})
		if err != nil {
			return err
		}
		st.done++
	}
	return nil
}

// next is tensor i of the file: its parameter's part of the gathered state, whole.
func (st *stateStream) next(i int) (*ts.Tensor, error) {
	a := st.at[i]
	if err := st.advance(a.step); err != nil {
		return nil, err
	}
	u := st.um.units[st.steps[a.step][0]]
	var t *ts.Tensor
	_ = torch.Untracked(func() error {
		t = st.flat.MustNarrow(0, u.offs[a.param], numel(u.shapes[a.param]), false).MustView(u.shapes[a.param], true)
		return nil
	})
	return t, nil
}

// finish gathers the steps not gathered yet (the other ranks own parameters there).
func (st *stateStream) finish() error { return st.advance(len(st.steps) - 1) }

func (st *stateStream) drop() {
	if st.flat != nil {
		st.flat.MustDrop()
		st.flat = nil
	}
}

// numel is the number of elements of a shape.
func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// RestoreOptim reads a trained sharded model's optimizer state (Trains) from a checkpoint's model
// folder, whatever stage and world size wrote it: the part of each whole tensor that lies in this
// rank's shards. Torch thread.
func (w *Weights) RestoreOptim(model string, opt *optim.AdamW, dir string) error {
	if !w.Trains(model) {
		return fmt.Errorf("model %s: no sharded trained weights here", model)
	}
	um := w.models[model]
	idx, sharded, err := rundir.ReadOptimIndex(dir)
	if err != nil {
		return err
	}
	st, err := rundir.ReadOptimState(dir)
	if err != nil {
		return err
	}
	opt.Step = st.Step
	file := func(name string) (string, error) {
		if !sharded {
			return filepath.Join(dir, "optim.safetensors"), nil
		}
		return idx.File(dir, name)
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
