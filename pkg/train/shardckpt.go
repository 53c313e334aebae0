package train

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

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/files"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
)

// optimIndexFile names the index of a sharded optimizer state.
const optimIndexFile = "optim.index.json"

// optimIndex is optim.index.json.
type optimIndex struct {
	WorldSize int               `json:"world_size"`
	Shard     string            `json:"shard"`
	WeightMap map[string]string `json:"weight_map"` // tensor name → file in the model folder
}

// optimShardFile is rank r's file of a world of w.
func optimShardFile(r, w int) string { return fmt.Sprintf("optim.rank-%d-of-%d.safetensors", r, w) }

// isSharded says whether the models' optimizer state is partitioned among the ranks.
func (t *Trainer) isSharded() bool {
	for _, ms := range t.models {
		if t.par.partition(ms.id) != nil {
			return true
		}
	}
	return false
}

// saveAlone is save where this rank may be the only one saving (after a failure of its own): a
// sharded checkpoint needs every rank's partition, written together (saveShards' barriers would
// wait for ranks that are elsewhere), so a sharded run keeps its last complete checkpoint instead.
func (t *Trainer) saveAlone() error {
	if t.isSharded() {
		log.Warn().Int("step", t.step).Msg("dist.shard: no checkpoint after a failure (it needs every rank's optimizer partition): --resume continues from the last one")
		return nil
	}
	return t.save()
}

// saveShards writes every rank's optimizer partitions into tmp (step-N.tmp): rank 0 makes the
// folders, each rank writes and syncs its own files, and all ranks meet again before rank 0 goes on
// to write the rest, the index and the manifest and to rename. Torch thread.
func (t *Trainer) saveShards(tmp string) error {
	g := t.group
	if g.Rank() == 0 {
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		for _, ms := range t.models {
			if err := os.MkdirAll(filepath.Join(tmp, ms.id), 0o755); err != nil {
				return err
			}
		}
	}
	if err := g.Barrier(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for _, ms := range t.models {
		path := filepath.Join(tmp, ms.id, optimShardFile(g.Rank(), g.Size()))
		names, tensors := optimTensors(ms.opt)
		if err := policy.SaveTensors(path, names, tensors); err != nil {
			return fmt.Errorf("checkpoint %s: optimizer partition: %w", ms.id, err)
		}
		if err := atomicfile.SyncTree(path); err != nil {
			return fmt.Errorf("checkpoint %s: %w", ms.id, err)
		}
	}
	if err := g.Barrier(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// saveOptimIndex writes a model's optim.json and optim.index.json (rank 0, after saveShards): the
// index lists every rank's tensors, which each rank's partition determines.
func saveOptimIndex(ms *modelState, part *partition, dir, stage string) error {
	idx := optimIndex{WorldSize: part.world, Shard: stage, WeightMap: map[string]string{}}
	for i, n := range ms.names {
		file := optimShardFile(part.owner[i], part.world)
		idx.WeightMap["exp_avg."+n] = file
		idx.WeightMap["exp_avg_sq."+n] = file
		if ms.params[i].DType() != gotch.Float { // AdamW keeps a float32 master copy
			idx.WeightMap["master."+n] = file
		}
	}
	b, _ := json.MarshalIndent(idx, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, optimIndexFile), b, 0o644); err != nil {
		return err
	}
	b, _ = json.MarshalIndent(optimState{Step: ms.opt.Step, LR: ms.opt.LR}, "", "  ")
	return os.WriteFile(filepath.Join(dir, "optim.json"), b, 0o644)
}

// readOptimIndex reads a model folder's optim.index.json and checks that every file it names is
// there; ok is false when the folder has none (an unsharded optimizer state).
func readOptimIndex(dir string) (idx optimIndex, ok bool, err error) {
	path := filepath.Join(dir, optimIndexFile)
	if _, err := os.Stat(path); os.IsNotExist(err) {
		return idx, false, nil
	}
	b, err := files.Read(path, files.MaxJSON)
	if err != nil {
		return idx, true, err
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return idx, true, fmt.Errorf("%s: %w", path, err)
	}
	if len(idx.WeightMap) == 0 || idx.WorldSize < 1 {
		return idx, true, fmt.Errorf("%s: no weight_map or no world_size", path)
	}
	for _, f := range idx.WeightMap {
		if !filepath.IsLocal(f) || filepath.Dir(f) != "." || !regularFile(filepath.Join(dir, f)) {
			return idx, true, fmt.Errorf("%s: missing (a partition %s names)", filepath.Join(dir, f), path)
		}
	}
	return idx, true, nil
}

// loadOptimState restores an optimizer (a rank's partition or the whole state) from a model folder,
// sharded (optim.index.json) or not (optim.safetensors), whatever world size wrote it. Torch thread.
func loadOptimState(o *optim.AdamW, dir string) error {
	idx, sharded, err := readOptimIndex(dir)
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
		f, ok := idx.WeightMap[n]
		if !ok {
			return fmt.Errorf("%s: no tensor %s (written by %d rank(s) with dist.shard %s)", filepath.Join(dir, optimIndexFile), n, idx.WorldSize, idx.Shard)
		}
		byFile[f] = append(byFile[f], i)
	}
	fileNames := make([]string, 0, len(byFile))
	for f := range byFile {
		fileNames = append(fileNames, f)
	}
	sort.Strings(fileNames)
	for _, f := range fileNames {
		var ns []string
		var ts []*ts.Tensor
		for _, i := range byFile[f] {
			ns = append(ns, names[i])
			ts = append(ts, tensors[i])
		}
		if err := policy.LoadTensorsInto(filepath.Join(dir, f), ns, ts); err != nil {
			return err
		}
	}
	return nil
}
