package rundir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/files"
	"github.com/rs/zerolog/log"
	"gopkg.in/yaml.v3"
)

// Verify checks that the checkpoint of step is complete, without loading it. Its manifest
// (manifest.go) must agree with the folder's name and with every file, sizes and CRC-32C; and, with
// or without a manifest, trainer.json must be an object whose step is the folder's, config.yaml must
// parse, every model of that config must have its weights, config.json and optimizer state, every
// JSON file must parse and every safetensors file must hold all the bytes its header promises.
//
// A checkpoint without a manifest (written by a drmas from before manifests) is complete when all
// of the rest holds; legacy reports that, so the caller can say no checksum vouched for it.
func Verify(ck string, step int) (legacy bool, err error) {
	m, err := ReadManifest(ck, step)
	switch {
	case errors.Is(err, ErrNoManifest):
		legacy = true
	case err != nil:
		return false, err
	default:
		if err := CheckManifest(ck, m); err != nil {
			return false, err
		}
	}
	st, err := ReadTrainerState(ck, step)
	if err != nil {
		return legacy, err
	}
	if m != nil && max(st.WorldSize, 1) != m.WorldSize {
		return legacy, fmt.Errorf("%s: world_size %d, %s says %d", filepath.Join(ck, "trainer.json"), st.WorldSize, ManifestFile, m.WorldSize)
	}
	cfgPath := filepath.Join(ck, "config.yaml")
	models, err := readModels(cfgPath)
	if err != nil {
		return legacy, err
	}
	for _, mc := range models {
		if mc.frozen { // weights only: no optimizer state
			if p := filepath.Join(ck, mc.ID, "config.json"); !RegularFile(p) {
				return legacy, fmt.Errorf("%s: missing (frozen base %s's config.json)", p, mc.ID)
			}
			if err := checkWeightFiles(filepath.Join(ck, mc.ID)); err != nil {
				return legacy, err
			}
			continue
		}
		weights := []string{"config.json", "optim.json"}
		if mc.adapter() {
			weights = []string{adapterConfigFile, adapterWeightsFile, "optim.json"}
		}
		for _, name := range weights {
			if p := filepath.Join(ck, mc.ID, name); !RegularFile(p) {
				return legacy, fmt.Errorf("%s: missing (model %s's %s)", p, mc.ID, name)
			}
		}
		// The optimizer state: optim.safetensors, or a sharded run's partitions and their index.
		if _, sharded, err := ReadOptimIndex(filepath.Join(ck, mc.ID)); err != nil {
			return legacy, err
		} else if p := filepath.Join(ck, mc.ID, "optim.safetensors"); !sharded && !RegularFile(p) {
			return legacy, fmt.Errorf("%s: missing (model %s's optim.safetensors, and no %s)", p, mc.ID, OptimIndexFile)
		}
		if !mc.adapter() {
			if err := checkWeightFiles(filepath.Join(ck, mc.ID)); err != nil {
				return legacy, err
			}
		}
		if err := checkOptimState(filepath.Join(ck, mc.ID), mc.adapter(), step, mc.ID); err != nil {
			return legacy, err
		}
	}
	return legacy, filepath.WalkDir(ck, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(path) {
		case ".json":
			b, err := files.Read(path, files.MaxJSON)
			if err != nil {
				return err
			}
			if !json.Valid(b) {
				return fmt.Errorf("%s: not valid JSON (truncated?)", path)
			}
		case ".safetensors":
			return checkFile(path)
		}
		return nil
	})
}

// A LoRA adapter's folder in a checkpoint is a PEFT folder: PEFT's two file names.
const (
	adapterConfigFile  = "adapter_config.json"
	adapterWeightsFile = "adapter_model.safetensors"
)

// savedModel is a model entry of a checkpoint's config.yaml, as far as its files go: an adapter
// (base set) saves a PEFT folder, a frozen base (another entry's base) its weights without
// optimizer state.
type savedModel struct {
	ID     string `yaml:"id"`
	Base   string `yaml:"base"`
	frozen bool
}

func (m savedModel) adapter() bool { return m.Base != "" }

// readModels reads the model entries of a checkpoint's config.yaml (the resolved config a run
// saved; pkg/config reads the whole of it).
func readModels(path string) ([]savedModel, error) {
	b, err := files.Read(path, files.MaxConfig)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Models []savedModel `yaml:"models"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, m := range doc.Models {
		if m.ID == "" {
			return nil, fmt.Errorf("%s: models[%d]: no id", path, i)
		}
		for _, o := range doc.Models {
			doc.Models[i].frozen = doc.Models[i].frozen || (o.Base == m.ID)
		}
	}
	return doc.Models, nil
}

// RegularFile reports whether path is a regular file.
func RegularFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// checkWeightFiles checks that a model folder holds its weights: model.safetensors, or, for a model
// saved in shards (pkg/policy/weights.go SaveSharded), model.safetensors.index.json and every shard it
// names.
func checkWeightFiles(dir string) error {
	if RegularFile(filepath.Join(dir, "model.safetensors")) {
		return nil
	}
	index := filepath.Join(dir, "model.safetensors.index.json")
	if !RegularFile(index) {
		return fmt.Errorf("%s: missing (and no model.safetensors.index.json for shards)", filepath.Join(dir, "model.safetensors"))
	}
	b, err := files.Read(index, files.MaxJSON)
	if err != nil {
		return err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return fmt.Errorf("%s: %w", index, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("%s: no weight_map", index)
	}
	for _, shard := range idx.WeightMap {
		if !filepath.IsLocal(shard) || !RegularFile(filepath.Join(dir, shard)) {
			return fmt.Errorf("%s: missing (a shard %s names)", filepath.Join(dir, shard), index)
		}
	}
	return nil
}

// ReadTrainerState reads a checkpoint's trainer.json and checks it against the folder's step: a JSON
// object (not null), with a step, the folder's, and a world size that is not negative. Anything else
// is damage, never "step 0".
func ReadTrainerState(ck string, step int) (TrainerState, error) {
	var st TrainerState
	path := filepath.Join(ck, "trainer.json")
	b, err := files.Read(path, files.MaxConfig)
	if err != nil {
		return st, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return st, fmt.Errorf("%s: %w", path, err)
	}
	if fields == nil {
		return st, fmt.Errorf("%s: null, not the trainer state", path)
	}
	if s, ok := fields["step"]; !ok || string(s) == "null" {
		return st, fmt.Errorf("%s: no step", path)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case st.Step < 0:
		return st, fmt.Errorf("%s: step %d is negative", path, st.Step)
	case st.Step != step:
		return st, fmt.Errorf("%s: step %d, but the folder is %s%d", path, st.Step, StepPrefix, step)
	case st.WorldSize < 0:
		return st, fmt.Errorf("%s: world_size %d is negative", path, st.WorldSize)
	}
	return st, nil
}

// TrainerState is what trainer.json records.
type TrainerState struct {
	Step    int            `json:"step"`
	Seed    int64          `json:"seed"`
	Saved   time.Time      `json:"saved"`
	Streaks map[string]int `json:"nonfinite_streaks"`
	// WorldSize is the number of data-parallel ranks that trained the run (0 in older checkpoints: 1).
	WorldSize int `json:"world_size,omitempty"`
	// Guard holds, per model and agent, the gradient guard's trailing share norms (algorithm.guard).
	Guard map[string]map[string][]float64 `json:"guard,omitempty"`
	// WarmupDone records that the format warm-up (warmup.go) is behind these weights, so a resume
	// from step-0 never runs it again. Every checkpoint drmas writes is taken after the warm-up; in
	// one from before this field (nil) it is done too.
	WarmupDone *bool `json:"warmup_done,omitempty"`
	// KLInRewardCoef is the KL-in-reward coefficient β in force for the next iteration
	// (algorithm.kl_in_reward; its adaptive controller's state); nil when off.
	KLInRewardCoef *float64 `json:"kl_in_reward_coef,omitempty"`
}

const StepPrefix = "step-"

// SyncTree and SyncDir flush a written checkpoint to disk (variables, for a test to watch the order).
var SyncTree, SyncDir = atomicfile.SyncTree, atomicfile.SyncDir

// CheckpointDir is the folder of the checkpoint taken after iteration step.
func CheckpointDir(runDir string, step int) string {
	return filepath.Join(runDir, StepPrefix+strconv.Itoa(step))
}

// Steps lists the steps of the step-N folders of a run, ascending, complete or not
// (Verify tells); step-N.tmp and other names are not checkpoints.
func Steps(runDir string) ([]int, error) {
	entries, err := os.ReadDir(runDir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), StepPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		s, err := strconv.Atoi(n)
		if err != nil || strconv.Itoa(s) != n {
			continue // step-N.tmp, step-N.damaged and others
		}
		steps = append(steps, s)
	}
	sort.Ints(steps)
	return steps, nil
}

// KeepAside renames a step-N folder to step-N.damaged (or step-N.damaged.2, …): a checkpoint that
// --resume skipped as incomplete (renamed then), or one that a new checkpoint of step N is about to
// replace (the trainer never saves one step twice, so only a skipped one can be there). drmas never
// deletes or overwrites a checkpoint it did not just write: its files stay for whoever looks.
func KeepAside(final string) error {
	if _, err := os.Lstat(final); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for i := 1; i < 1000; i++ {
		aside := final + ".damaged"
		if i > 1 {
			aside += "." + strconv.Itoa(i)
		}
		if _, err := os.Lstat(aside); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.Rename(final, aside); err != nil {
			return err
		}
		log.Warn().Str("checkpoint", final).Str("kept_as", aside).Msg("a damaged checkpoint skipped at resume: kept under another name, never overwritten or pruned")
		return atomicfile.SyncDir(filepath.Dir(final))
	}
	return fmt.Errorf("%s: cannot keep it aside: %s.damaged … .damaged.999 all exist", final, final)
}

// LinkFiles hard-links every file of the folder src into a new folder dst and says whether it did:
// a frozen base is the same in every checkpoint of a run, so each checkpoint after the first links
// the previous one's files instead of writing the weights again (for a 7B base, 15 GB a
// checkpoint). Deleting either checkpoint leaves the other's files whole, and drmas never writes
// into a checkpoint's files. Anything else (no src, a subfolder, a file system without hard links)
// leaves dst absent and returns false: the caller writes the base.
func LinkFiles(src, dst string) bool {
	if src == "" {
		return false
	}
	entries, err := os.ReadDir(src)
	if err != nil || len(entries) == 0 {
		return false
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return false
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || os.Link(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())) != nil {
			os.RemoveAll(dst) // dst is inside the step-N.tmp folder this save made: drmas's own
			return false
		}
	}
	return true
}

// LinkedIntact says whether every file under <id>/ in the new checkpoint tmp (step) has, in tmp's
// manifest, the size and CRC-32C the manifest of the checkpoint holding src (…/step-M/<id>) lists
// for it.
func LinkedIntact(tmp, src, id string, step int) bool {
	prev, err := ReadManifest(filepath.Dir(src), -1)
	if err != nil {
		return false
	}
	now, err := ReadManifest(tmp, step)
	if err != nil {
		return false
	}
	was := map[string]ManifestEntry{}
	for _, f := range prev.Files {
		was[f.Path] = f
	}
	n := 0
	for _, f := range now.Files {
		if !strings.HasPrefix(f.Path, id+"/") {
			continue
		}
		n++
		if w, ok := was[f.Path]; !ok || w.Size != f.Size || w.CRC32C != f.CRC32C {
			return false
		}
	}
	return n > 0
}

// OptimIndexFile names the index of a sharded optimizer state.
const OptimIndexFile = "optim.index.json"

// OptimIndex is optim.index.json.
type OptimIndex struct {
	WorldSize int               `json:"world_size"`
	Shard     string            `json:"shard"`
	WeightMap map[string]string `json:"weight_map"` // tensor name → file in the model folder
}

// File is the path of the file of dir (the model folder of the index) that holds the optimizer
// tensor name; an error names the index and what wrote it when it lists no such tensor.
func (idx OptimIndex) File(dir, name string) (string, error) {
	f, ok := idx.WeightMap[name]
	if !ok {
		return "", fmt.Errorf("%s: no tensor %s (written by %d rank(s) with dist.shard %s)", filepath.Join(dir, OptimIndexFile), name, idx.WorldSize, idx.Shard)
	}
	return filepath.Join(dir, f), nil
}

// OptimShardFile is rank r's file of a world of w.
func OptimShardFile(r, w int) string { return fmt.Sprintf("optim.rank-%d-of-%d.safetensors", r, w) }

// ReadOptimIndex reads a model folder's optim.index.json and checks that every file it names is
// there; ok is false when the folder has none (an unsharded optimizer state).
func ReadOptimIndex(dir string) (idx OptimIndex, ok bool, err error) {
	path := filepath.Join(dir, OptimIndexFile)
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
		if !filepath.IsLocal(f) || filepath.Dir(f) != "." || !RegularFile(filepath.Join(dir, f)) {
			return idx, true, fmt.Errorf("%s: missing (a partition %s names)", filepath.Join(dir, f), path)
		}
	}
	return idx, true, nil
}

// Seal makes a written folder (a checkpoint's step-N.tmp, or the KL reference) durable and
// verifiable: every file synced to disk, then its manifest written (step, world size).
func Seal(dir string, step, world int) error {
	if err := SyncTree(dir); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := WriteManifest(dir, step, world); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// Publish makes a sealed step-N.tmp the checkpoint step-N: a step-N already there (one --resume
// skipped as damaged) is kept aside first, then tmp is renamed and the run folder synced, so
// neither a crash nor a power loss leaves a half checkpoint named step-N. It returns step-N.
func Publish(tmp string) (string, error) {
	final := strings.TrimSuffix(tmp, ".tmp")
	if err := KeepAside(final); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	if err := SyncDir(filepath.Dir(final)); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return final, nil
}

// Prune keeps the newest keep checkpoints up to step (step-0, the post-warm-up weights, counts like
// any other; keep 0 keeps all). Checkpoints --resume skipped as damaged were renamed aside
// (step-N.damaged) and are not step-N folders any more: they neither count nor go.
func Prune(run string, step, keep int) error {
	if keep <= 0 {
		return nil
	}
	all, err := Steps(run)
	if err != nil {
		return err
	}
	var steps []int
	for _, s := range all {
		if s <= step {
			steps = append(steps, s)
		}
	}
	for len(steps) > keep {
		if err := os.RemoveAll(CheckpointDir(run, steps[0])); err != nil {
			return err
		}
		steps = steps[1:]
	}
	return nil
}
