package train

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

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// A checkpoint is a folder <run>/step-N holding, per model, a Hugging Face model folder <id>/ (config.json,
// model.safetensors, tokenizer files) with the optimizer state beside it (optim.safetensors,
// optim.json) — for a LoRA adapter a PEFT adapter folder (adapter_config.json,
// adapter_model.safetensors) with its optimizer state, and its frozen base once, without one (after a
// run's first checkpoint, hard links to the previous checkpoint's files) — plus trainer.json, the resolved config.yaml and, written last, manifest.json (every
// file's size and CRC-32C: manifest.go). It is written as step-N.tmp, synced file by file, and renamed,
// the run folder synced after the rename, so neither a crash nor a power loss leaves a half checkpoint
// named step-N. verifyCheckpoint (resume.go) decides whether a step-N folder is complete.

// trainerState is what trainer.json records.
type trainerState struct {
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
}

type optimState struct {
	Step int     `json:"step"`
	LR   float64 `json:"lr"`
}

const stepPrefix = "step-"

// syncTree and syncDir flush a written checkpoint to disk (variables, for a test to watch the order).
var syncTree, syncDir = atomicfile.SyncTree, atomicfile.SyncDir

// CheckpointDir is the folder of the checkpoint taken after iteration step.
func CheckpointDir(runDir string, step int) string {
	return filepath.Join(runDir, stepPrefix+strconv.Itoa(step))
}

// checkpointSteps lists the steps of the step-N folders of a run, ascending, complete or not
// (verifyCheckpoint tells); step-N.tmp and other names are not checkpoints.
func checkpointSteps(runDir string) ([]int, error) {
	entries, err := os.ReadDir(runDir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), stepPrefix)
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

// save writes the checkpoint of the last completed iteration and prunes old ones. Torch thread.
func (t *Trainer) save() error {
	t.saved = true
	began := time.Now()
	final := CheckpointDir(t.dir, t.step)
	tmp := final + ".tmp"
	sharded := t.isSharded()
	if sharded { // every rank writes its optimizer partition into tmp (shardckpt.go)
		if err := t.saveShards(tmp); err != nil {
			return err
		}
	}
	if t.group.Rank() != 0 {
		return nil // data-parallel: rank 0 writes the rest
	}
	if !sharded {
		if err := os.RemoveAll(tmp); err != nil { // a checkpoint a crash cut short: never renamed, never complete
			return err
		}
	}
	for _, ms := range t.models {
		dir := filepath.Join(tmp, ms.id)
		if err := ms.pol.Save(dir); err != nil {
			return fmt.Errorf("checkpoint %s: %w", ms.id, err)
		}
		var err error
		if sharded {
			err = saveOptimIndex(ms, t.par.partition(ms.id), dir, t.Config.Dist.Shard)
		} else {
			err = saveOptim(ms.opt, dir)
		}
		if err != nil {
			return fmt.Errorf("checkpoint %s: optimizer: %w", ms.id, err)
		}
	}
	var linked []string                  // frozen bases hard-linked from the previous checkpoint
	for _, mc := range t.Config.Models { // each frozen base once, for its adapters (no optimizer state)
		if !t.Config.IsFrozenBase(mc.ID) {
			continue
		}
		dst := filepath.Join(tmp, mc.ID)
		if linkFiles(t.savedBases[mc.ID], dst) {
			linked = append(linked, mc.ID)
			continue
		}
		if err := t.Router[mc.ID].Save(dst); err != nil {
			return fmt.Errorf("checkpoint %s (frozen base): %w", mc.ID, err)
		}
	}
	done := true
	st := trainerState{Step: t.step, Seed: t.Config.Run.Seed, Saved: time.Now().UTC(), Streaks: map[string]int{}, WorldSize: t.group.Size(),
		WarmupDone: &done}
	for _, ms := range t.models {
		st.Streaks[ms.id] = ms.streak
		if ms.guard != nil {
			if st.Guard == nil {
				st.Guard = map[string]map[string][]float64{}
			}
			st.Guard[ms.id] = ms.guard.state()
		}
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "trainer.json"), b, 0o644); err != nil {
		return err
	}
	y, err := t.Config.YAML()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "config.yaml"), y, 0o644); err != nil {
		return err
	}
	if err := syncTree(tmp); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	summed := time.Now()
	if err := writeManifest(tmp, t.step, t.group.Size()); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := t.repairLinked(tmp, linked); err != nil {
		return err
	}
	checksums := time.Since(summed)
	if err := keepAside(final); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if err := syncDir(t.dir); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for _, mc := range t.Config.Models {
		if t.Config.IsFrozenBase(mc.ID) {
			if t.savedBases == nil {
				t.savedBases = map[string]string{}
			}
			t.savedBases[mc.ID] = filepath.Join(final, mc.ID)
		}
	}
	log.Info().Int("step", t.step).Str("dir", final).Dur("took", time.Since(began).Round(time.Millisecond)).
		Dur("manifest", checksums.Round(time.Millisecond)).Msg("checkpoint saved")
	return t.prune()
}

// keepAside renames a step-N folder to step-N.damaged (or step-N.damaged.2, …): a checkpoint that
// --resume skipped as incomplete (renamed then), or one that a new checkpoint of step N is about to
// replace (the trainer never saves one step twice, so only a skipped one can be there). drmas never
// deletes or overwrites a checkpoint it did not just write: its files stay for whoever looks.
func keepAside(final string) error {
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

// prune keeps the newest keep_last checkpoints up to the current step (step-0, the post-warm-up
// weights, counts like any other). Checkpoints --resume skipped as damaged were renamed aside
// (step-N.damaged) and are not step-N folders any more: they neither count nor go.
func (t *Trainer) prune() error {
	keep := t.Config.Run.KeepLast
	if keep <= 0 {
		return nil
	}
	all, err := checkpointSteps(t.dir)
	if err != nil {
		return err
	}
	var steps []int
	for _, s := range all {
		if s <= t.step {
			steps = append(steps, s)
		}
	}
	for len(steps) > keep {
		if err := os.RemoveAll(CheckpointDir(t.dir, steps[0])); err != nil {
			return err
		}
		steps = steps[1:]
	}
	return nil
}

// linkFiles hard-links every file of the folder src into a new folder dst and says whether it did:
// a frozen base is the same in every checkpoint of a run, so each checkpoint after the first links
// the previous one's files instead of writing the weights again (for a 7B base, 15 GB a
// checkpoint). Deleting either checkpoint leaves the other's files whole, and drmas never writes
// into a checkpoint's files. Anything else (no src, a subfolder, a file system without hard links)
// leaves dst absent and returns false: the caller writes the base.
func linkFiles(src, dst string) bool {
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

// repairLinked checks the frozen bases linked into the checkpoint tmp (whose manifest is written)
// against the previous checkpoint's manifest: a linked file whose size or CRC-32C differs from what
// was recorded when it was written changed on disk since (damage, an edit), so the base is written
// again from memory and the manifest redone. A damaged base is never carried into a new checkpoint.
func (t *Trainer) repairLinked(tmp string, linked []string) error {
	repaired := false
	for _, id := range linked {
		if linkedIntact(tmp, t.savedBases[id], id, t.step) {
			continue
		}
		log.Warn().Str("model", id).Str("from", t.savedBases[id]).Msg("the frozen base in the previous checkpoint changed on disk since it was written: writing it again from memory")
		dst := filepath.Join(tmp, id)
		if err := os.RemoveAll(dst); err != nil { // links inside this save's step-N.tmp
			return err
		}
		if err := t.Router[id].Save(dst); err != nil {
			return fmt.Errorf("checkpoint %s (frozen base): %w", id, err)
		}
		repaired = true
	}
	if !repaired {
		return nil
	}
	if err := syncTree(tmp); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := writeManifest(tmp, t.step, t.group.Size()); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// linkedIntact says whether every file under <id>/ in the new checkpoint tmp (step) has, in tmp's
// manifest, the size and CRC-32C the manifest of the checkpoint holding src (…/step-M/<id>) lists
// for it.
func linkedIntact(tmp, src, id string, step int) bool {
	prev, err := readManifest(filepath.Dir(src), -1)
	if err != nil {
		return false
	}
	now, err := readManifest(tmp, step)
	if err != nil {
		return false
	}
	was := map[string]manifestFile{}
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

func saveOptim(o *optim.AdamW, dir string) error {
	names, tensors := optimTensors(o)
	if err := policy.SaveTensors(filepath.Join(dir, "optim.safetensors"), names, tensors); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(optimState{Step: o.Step, LR: o.LR}, "", "  ")
	return os.WriteFile(filepath.Join(dir, "optim.json"), b, 0o644)
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
	b, err := os.ReadFile(filepath.Join(dir, "optim.json"))
	if err != nil {
		return err
	}
	var st optimState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "optim.json"), err)
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

// restore continues from a checkpoint: the models were loaded from it by buildModels; this restores
// the optimizers, the trainer state and the metrics file.
func (t *Trainer) restore(ck string) error {
	st, err := readTrainerState(ck, checkpointStep(ck))
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if st.Step > t.Config.Run.Steps {
		return fmt.Errorf("resume from %s: the checkpoint is past run.steps (%d > %d): raise run.steps to train on (--set run.steps=N), or evaluate it with drmas eval --checkpoint",
			ck, st.Step, t.Config.Run.Steps)
	}
	err = torch.Do(func() error {
		for _, ms := range t.models {
			// Any world size and shard stage: each rank reads the tensors it now holds (shardckpt.go).
			if err := loadOptimState(ms.opt, filepath.Join(ck, ms.id)); err != nil {
				return fmt.Errorf("resume %s: optimizer: %w", ms.id, err)
			}
			ms.streak = st.Streaks[ms.id]
			if ms.guard != nil {
				ms.guard.restore(st.Guard[ms.id])
			}
		}
		return t.loadReference()
	})
	if err != nil {
		return err
	}
	t.step = st.Step
	t.resumed, t.saved = true, true
	t.warmupDone = st.WarmupDone == nil || *st.WarmupDone
	if t.group.Rank() == 0 {
		if err := truncateMetrics(t.dir, t.step); err != nil {
			return err
		}
	}
	log.Info().Int("step", t.step).Str("checkpoint", ck).Msg("resumed")
	return nil
}

// referenceDir holds the KL reference weights (the models at the start of RL).
func (t *Trainer) referenceDir() string { return filepath.Join(t.dir, "reference") }

// saveReference freezes the current weights as the KL reference and writes them to the run folder.
func (t *Trainer) saveReference() error {
	if err := t.makeReference(); err != nil {
		return err
	}
	if t.group.Rank() != 0 {
		return nil
	}
	wrote := false
	for _, ms := range t.models {
		if ms.ref != nil {
			if err := ms.ref.Model.Save(filepath.Join(t.referenceDir(), ms.id)); err != nil {
				return fmt.Errorf("KL reference %s: %w", ms.id, err)
			}
			wrote = true
		}
	}
	if !wrote {
		return nil
	}
	// Synced and checksummed like a checkpoint (the manifest says step 0: the weights RL starts from).
	if err := syncTree(t.referenceDir()); err != nil {
		return fmt.Errorf("KL reference: %w", err)
	}
	if err := writeManifest(t.referenceDir(), 0, t.group.Size()); err != nil {
		return fmt.Errorf("KL reference: %w", err)
	}
	return syncDir(t.dir)
}

// loadReference reloads the KL reference weights of a resumed run, checked against their manifest
// (a reference written before manifests has none and is loaded as it is).
func (t *Trainer) loadReference() error {
	if t.anyKL() {
		m, err := readManifest(t.referenceDir(), 0)
		if err == nil {
			err = checkManifest(t.referenceDir(), m)
		}
		if err != nil && !errors.Is(err, errNoManifest) {
			return fmt.Errorf("resume: KL reference: %w", err)
		}
	}
	for _, ms := range t.models {
		if !ms.usesKL() {
			continue
		}
		var m *policy.Model
		var err error
		if a := ms.pol.Model.Adapter(); a != nil { // an adapter's reference: its starting adapter on the same base
			var ra *policy.Adapter
			if ra, err = policy.LoadAdapter(filepath.Join(t.referenceDir(), ms.id), ms.id, ms.pol.Model.Base(), a.DType()); err == nil {
				m, err = ms.pol.Model.Base().WithAdapter(ra)
			}
		} else {
			m, err = policy.Load(filepath.Join(t.referenceDir(), ms.id), ms.pol.Model.Device(), ms.pol.Model.DType())
		}
		if err != nil {
			return fmt.Errorf("resume: KL reference of %s: %w", ms.id, err)
		}
		if ms.ref, err = policy.NewPolicy(ms.id+"-ref", m, ms.pol.Tok, ms.pol.Chat); err != nil {
			return err
		}
	}
	return nil
}
