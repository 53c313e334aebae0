package train

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/shard"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// The optimizer state in a checkpoint, beside each model's weights: optim.safetensors (exp_avg.*,
// exp_avg_sq.*, and master.* for half parameters) and optim.json (the step and learning rate).
//
// Checkpoints of sharded training (dist.shard optimizer / gradients). The model folders are rank 0's,
// as unsharded (every rank holds the whole weights). The optimizer state is written by every rank,
// its partition only, beside the model's weights:
//
//	<id>/optim.rank-R-of-W.safetensors   rank R's exp_avg.*, exp_avg_sq.* (and master.*) tensors
//	<id>/optim.index.json                which file holds which tensor (weight_map), the world size
//	                                     and the shard stage that wrote them
//	<id>/optim.json                      the step and learning rate, as unsharded
//
// All of it goes into the step-N.tmp folder that becomes step-N by one rename (rank 0's, after every
// rank has written and synced its partition), so a checkpoint is whole or is not a checkpoint.
// --resume reads the tensors each rank now needs through the index, whatever world size and stage
// wrote them and whatever world size and stage read them: 2 sharded ranks → 1 process or 2 unsharded
// ranks, 1 process → 2 sharded ranks; an unsharded checkpoint (optim.safetensors) is read the same way.

// saveOptim writes a model's whole optimizer state: its tensors, which carry the step and model they
// belong to (rundir.OptimMeta), and optim.json.
func saveOptim(o *optim.AdamW, dir string, meta map[string]string) error {
	names, tensors := optimTensors(o)
	if err := policy.SaveTensors(filepath.Join(dir, "optim.safetensors"), names, tensors, meta); err != nil {
		return err
	}
	return rundir.WriteOptimState(dir, rundir.OptimState{Step: o.Step, LR: o.LR})
}

func loadOptim(o *optim.AdamW, dir string) error {
	if err := loadOptimStep(o, dir); err != nil {
		return err
	}
	names, tensors := optimTensors(o)
	return policy.LoadTensorsInto(filepath.Join(dir, "optim.safetensors"), names, tensors)
}

// loadOptimStep restores the optimizer's step count from dir's optim.json.
func loadOptimStep(o *optim.AdamW, dir string) error {
	st, err := rundir.ReadOptimState(dir)
	if err != nil {
		return err
	}
	o.Step = st.Step
	return nil
}

// optimTensors lists the optimizer state under the names optim.safetensors uses.
func optimTensors(o *optim.AdamW) ([]string, []*ts.Tensor) {
	var names []string
	var tensors []*ts.Tensor
	for i, n := range o.Names {
		names = append(names, "exp_avg."+n, "exp_avg_sq."+n)
		tensors = append(tensors, o.M[i], o.V[i])
		if o.SavedMaster(i) { // a half parameter's (an offloaded float32 one's copy is rebuilt from it)
			names = append(names, "master."+n)
			tensors = append(tensors, o.Master[i])
		}
	}
	return names, tensors
}

// saveOptimIndex writes a model's optim.json and optim.index.json (rank 0, after saveShards): the
// index lists every rank's tensors, which each rank's partition determines.
func saveOptimIndex(ms *modelState, part *shard.Partition, dir, stage string) error {
	idx := rundir.OptimIndex{WorldSize: part.World, Shard: stage, WeightMap: map[string]string{}}
	// The model's parameters (under dist.shard parameters the optimizer steps shards of them; the
	// state is written per parameter all the same: pkg/shard's optimstate.go).
	names, params := policy.SplitParams(ms.pol.Model.Parameters())
	for i, n := range names {
		file := rundir.OptimShardFile(part.Owner[i], part.World)
		idx.WeightMap["exp_avg."+n] = file
		idx.WeightMap["exp_avg_sq."+n] = file
		if params[i].DType() != gotch.Float { // AdamW keeps a float32 master copy
			idx.WeightMap["master."+n] = file
		}
	}
	b, _ := json.MarshalIndent(idx, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, rundir.OptimIndexFile), b, 0o644); err != nil {
		return err
	}
	return rundir.WriteOptimState(dir, rundir.OptimState{Step: ms.opt.Step, LR: ms.opt.LR})
}

// loadOptimState restores an optimizer (a rank's partition or the whole state) from a model folder,
// sharded (optim.index.json) or not (optim.safetensors), whatever world size wrote it. Torch thread.
func loadOptimState(o *optim.AdamW, dir string) error {
	idx, sharded, err := rundir.ReadOptimIndex(dir)
	if err != nil {
		return err
	}
	if !sharded {
		return loadOptim(o, dir)
	}
	if err := loadOptimStep(o, dir); err != nil {
		return err
	}
	names, tensors := optimTensors(o)
	byFile := map[string][]int{}
	for i, n := range names {
		f, err := idx.File(dir, n)
		if err != nil {
			return err
		}
		byFile[f] = append(byFile[f], i)
	}
	for _, f := range slices.Sorted(maps.Keys(byFile)) {
		var ns []string
		var ts []*ts.Tensor
		for _, i := range byFile[f] {
			ns = append(ns, names[i])
			ts = append(ts, tensors[i])
		}
		if err := policy.LoadTensorsInto(f, ns, ts); err != nil {
			return err
		}
	}
	return nil
}
