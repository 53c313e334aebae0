package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/rollout"
	"github.com/drmas/drmas/pkg/rundir"
)

// A checkpoint is a folder <run>/step-N holding, per model, a Hugging Face model folder <id>/ (config.json,
// model.safetensors, tokenizer files) with the optimizer state beside it (optim.safetensors,
// optim.json; sharded: every rank's partition and optim.index.json) — for a LoRA adapter a PEFT
// adapter folder (adapter_config.json, adapter_model.safetensors) with its optimizer state, and its
// frozen base once, without one (after a run's first checkpoint, hard links to the previous
// checkpoint's files) — plus trainer.json, the resolved config.yaml and, written last, manifest.json.
// pkg/rundir owns the format: it seals and publishes the folder (step-N.tmp synced, the manifest
// written, renamed to step-N) and decides at --resume whether a step-N folder is complete.

// checkpointer writes a run's checkpoints from the trainer's parts and restores them: the run folder
// it holds locked from New to Close, the config, the frozen bases (router), the parallel strategy
// (which rank writes what), and each frozen base's folder in the last checkpoint this process wrote,
// which the next one hard-links instead of writing the unchanged weights again.
type checkpointer struct {
	dir        string
	run        config.RunConfig // the resolved run section: seed, steps, keep_last
	lock       *rundir.Lock
	cfg        *config.Config
	router     policy.Router
	par        parallel
	savedBases map[string]string
	klCoef     *normalize.AdaptiveKL // the KL-in-reward coefficient (nil when off), saved in trainer.json
}

// save writes the checkpoint of iteration step and prunes old ones. Under dist.shard: parameters
// rank 0 writes the models unit by unit, every other rank taking part in its gathers (settle). Torch
// thread.
func (c *checkpointer) save(step int, models []*modelState, pending []byte) error {
	sharded := c.sharded(models)
	if sharded { // every rank writes its optimizer partition into tmp
		if err := c.saveShards(rundir.CheckpointDir(c.dir, step)+".tmp", step, models); err != nil {
			return err
		}
	}
	var err error
	if c.par.group().Rank() == 0 { // data-parallel: rank 0 writes the rest
		err = c.write(step, models, pending, sharded)
	}
	if serr := c.par.settle(); err == nil {
		err = serr
	}
	return err
}

// write is save's part on rank 0 (or one process): the models, the frozen bases, the trainer state,
// the seal and the rename.
func (c *checkpointer) write(step int, models []*modelState, pending []byte, sharded bool) error {
	began := time.Now()
	tmp := rundir.CheckpointDir(c.dir, step) + ".tmp"
	g := c.par.group()
	if !sharded {
		if err := os.RemoveAll(tmp); err != nil { // a checkpoint a crash cut short: never renamed, never complete
			return err
		}
	}
	if err := c.saveModels(tmp, step, models); err != nil {
		return err
	}
	linked, err := c.saveBases(tmp)
	if err != nil {
		return err
	}
	if err := c.saveState(tmp, step, models); err != nil {
		return err
	}
	if pending != nil { // the rollouts generated ahead of training (pkg/rollout)
		if err := os.WriteFile(filepath.Join(tmp, rollout.PendingFile), pending, 0o644); err != nil {
			return err
		}
	}
	if err := rundir.Seal(tmp, step, g.Size()); err != nil {
		return err
	}
	if err := c.repairLinked(tmp, step, linked); err != nil {
		return err
	}
	final, err := rundir.Publish(tmp)
	if err != nil {
		return err
	}
	for _, mc := range c.cfg.Models {
		if c.cfg.IsFrozenBase(mc.ID) {
			if c.savedBases == nil {
				c.savedBases = map[string]string{}
			}
			c.savedBases[mc.ID] = filepath.Join(final, mc.ID)
		}
	}
	log.Info().Int("step", step).Str("dir", final).Dur("took", time.Since(began).Round(time.Millisecond)).Msg("checkpoint saved")
	return rundir.Prune(c.dir, step, c.run.KeepLast)
}

// saveModels writes each trained model's folder and its optimizer state (partitioned: the index of
// the partitions the ranks wrote, saveShards).
func (c *checkpointer) saveModels(tmp string, step int, models []*modelState) error {
	for _, ms := range models {
		dir := filepath.Join(tmp, ms.id)
		if err := ms.pol.Save(dir); err != nil {
			return fmt.Errorf("checkpoint %s: %w", ms.id, err)
		}
		var err error
		if part := c.par.partition(ms.id); part != nil {
			err = saveOptimIndex(ms, part, dir, c.cfg.Dist.Shard)
		} else {
			err = saveOptim(ms.opt, dir, rundir.OptimMeta(step, ms.id, 0, 1))
		}
		if err != nil {
			return fmt.Errorf("checkpoint %s: optimizer: %w", ms.id, err)
		}
	}
	return nil
}

// saveBases writes each frozen base once, for its adapters (no optimizer state), or hard-links the
// previous checkpoint's files; it returns the linked ones.
func (c *checkpointer) saveBases(tmp string) ([]string, error) {
	var linked []string
	for _, mc := range c.cfg.Models {
		if !c.cfg.IsFrozenBase(mc.ID) {
			continue
		}
		dst := filepath.Join(tmp, mc.ID)
		if rundir.LinkFiles(c.savedBases[mc.ID], dst) {
			linked = append(linked, mc.ID)
			continue
		}
		if err := c.router[mc.ID].Save(dst); err != nil {
			return nil, fmt.Errorf("checkpoint %s (frozen base): %w", mc.ID, err)
		}
	}
	return linked, nil
}

// saveState writes trainer.json (the step, the non-finite streaks, the guard's windows) and the
// resolved config.yaml.
func (c *checkpointer) saveState(tmp string, step int, models []*modelState) error {
	done := true
	st := rundir.TrainerState{Step: step, Seed: c.run.Seed, Saved: time.Now().UTC(), Streaks: map[string]int{}, WorldSize: c.par.group().Size(),
		WarmupDone: &done}
	if c.klCoef != nil {
		st.KLInRewardCoef = &c.klCoef.Coef
	}
	for _, ms := range models {
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
	y, err := c.cfg.YAML()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(tmp, "config.yaml"), y, 0o644)
}

// repairLinked checks the frozen bases linked into the checkpoint tmp (whose manifest is written)
// against the previous checkpoint's manifest: a linked file whose size or CRC-32C differs from what
// was recorded when it was written changed on disk since (damage, an edit), so the base is written
// again from memory and the folder sealed again. A damaged base is never carried into a new checkpoint.
func (c *checkpointer) repairLinked(tmp string, step int, linked []string) error {
	repaired := false
	for _, id := range linked {
		if rundir.LinkedIntact(tmp, c.savedBases[id], id, step) {
			continue
		}
		log.Warn().Str("model", id).Str("from", c.savedBases[id]).Msg("the frozen base in the previous checkpoint changed on disk since it was written: writing it again from memory")
		dst := filepath.Join(tmp, id)
		if err := os.RemoveAll(dst); err != nil { // links inside this save's step-N.tmp
			return err
		}
		if err := c.router[id].Save(dst); err != nil {
			return fmt.Errorf("checkpoint %s (frozen base): %w", id, err)
		}
		repaired = true
	}
	if !repaired {
		return nil
	}
	return rundir.Seal(tmp, step, c.par.group().Size())
}

// restore reads a checkpoint's trainer state and restores the models' optimizers (any world size and
// shard stage: each rank reads the tensors it now holds), non-finite streaks, guard windows and KL
// references; the models were loaded from it by LoadTeam. Torch thread.
func (c *checkpointer) restore(ck string, models []*modelState) (rundir.TrainerState, error) {
	st, err := rundir.ReadTrainerState(ck, rundir.StepOf(ck))
	if err != nil {
		return st, fmt.Errorf("resume: %w", err)
	}
	if st.Step > c.run.Steps {
		return st, fmt.Errorf("resume from %s: the checkpoint is past run.steps (%d > %d): raise run.steps to train on (--set run.steps=N), or evaluate it with drmas eval --checkpoint",
			ck, st.Step, c.run.Steps)
	}
	if c.klCoef != nil && st.KLInRewardCoef != nil { // a checkpoint from before kl_in_reward keeps the configured β
		c.klCoef.Coef = *st.KLInRewardCoef
	}
	for _, ms := range models {
		if err := c.par.restore(ms.id, ms.opt, filepath.Join(ck, ms.id)); err != nil {
			return st, fmt.Errorf("resume %s: optimizer: %w", ms.id, err)
		}
		ms.streak = st.Streaks[ms.id]
		if ms.guard != nil {
			ms.guard.restore(st.Guard[ms.id])
		}
	}
	return st, c.loadReference(models)
}

// referenceDir holds the KL reference weights (the models at the start of RL).
func (c *checkpointer) referenceDir() string { return filepath.Join(c.dir, referenceDir) }

// referenceDir holds the KL references under run.dir.
var referenceDir = rundir.Own("reference")

// saveReference freezes the models' current weights as their KL references and writes them to the
// run folder (rank 0), synced and checksummed like a checkpoint (the manifest says step 0: the
// weights RL starts from). Torch thread.
func (c *checkpointer) saveReference(models []*modelState) error {
	err := c.writeReference(models)
	if serr := c.par.settle(); err == nil { // rank 0 wrote sharded references unit by unit
		err = serr
	}
	return err
}

// writeReference is saveReference but the settle.
func (c *checkpointer) writeReference(models []*modelState) error {
	// Every reference first: a sharded one joins the ranks' rounds (their requests are per model),
	// and every rank must know the same models before rank 0's writes make rounds.
	for _, ms := range models {
		if ms.usesKL() {
			if err := ms.makeReference(); err != nil {
				return err
			}
		}
	}
	wrote := false
	for _, ms := range models {
		if !ms.usesKL() || c.par.group().Rank() != 0 {
			continue
		}
		if err := ms.ref.Model.Save(filepath.Join(c.referenceDir(), ms.id)); err != nil {
			return fmt.Errorf("KL reference %s: %w", ms.id, err)
		}
		wrote = true
	}
	if !wrote {
		return nil
	}
	if err := rundir.Seal(c.referenceDir(), 0, c.par.group().Size()); err != nil {
		return fmt.Errorf("KL reference: %w", err)
	}
	return rundir.SyncDir(c.dir)
}

// loadReference reloads the KL reference weights of a resumed run, checked against their manifest
// (a reference written before manifests has none and is loaded as it is).
func (c *checkpointer) loadReference(models []*modelState) error {
	if anyKL(models) {
		m, err := rundir.ReadManifest(c.referenceDir(), 0)
		if err == nil {
			err = rundir.CheckManifest(c.referenceDir(), m)
		}
		if err != nil && !errors.Is(err, rundir.ErrNoManifest) {
			return fmt.Errorf("resume: KL reference: %w", err)
		}
	}
	for _, ms := range models {
		if !ms.usesKL() {
			continue
		}
		var m *policy.Model
		var err error
		if a := ms.pol.Model.Adapter(); a != nil { // an adapter's reference: its starting adapter on the same base
			var ra *policy.Adapter
			if ra, err = policy.LoadAdapter(filepath.Join(c.referenceDir(), ms.id), ms.id, ms.pol.Model.Base(), a.DType()); err == nil {
				m, err = ms.pol.Model.Base().WithAdapter(ra)
			}
		} else {
			m, err = policy.Load(filepath.Join(c.referenceDir(), ms.id), ms.pol.Model.Device(), ms.pol.Model.DType())
		}
		if err != nil {
			return fmt.Errorf("resume: KL reference of %s: %w", ms.id, err)
		}
		if err := c.par.adopt(ms.id+"-ref", m, false); err != nil { // sharded like the model
			return err
		}
		if ms.ref, err = policy.NewPolicy(ms.id+"-ref", m, ms.pol.Tok, ms.pol.Chat); err != nil {
			return err
		}
	}
	return nil
}

// sharded says whether the models' optimizer state is partitioned among the ranks.
func (c *checkpointer) sharded(models []*modelState) bool {
	for _, ms := range models {
		if c.par.partition(ms.id) != nil {
			return true
		}
	}
	return false
}

// everyRank says whether a checkpoint needs every rank: a partitioned optimizer state, or weights
// sharded among the ranks (dist.shard: parameters, frozen bases included).
func (c *checkpointer) everyRank(models []*modelState) bool {
	for _, mc := range c.cfg.Models {
		if c.par.sharded(mc.ID) {
			return true
		}
	}
	return c.sharded(models)
}

// saveAlone is save where this rank may be the only one saving (after a failure of its own): a
// sharded checkpoint needs every rank's partition, written together (saveShards' barriers would
// wait for ranks that are elsewhere), so a sharded run keeps its last complete checkpoint instead.
func (c *checkpointer) saveAlone(step int, models []*modelState, pending []byte) error {
	if c.everyRank(models) {
		log.Warn().Int("step", step).Msg("dist.shard: no checkpoint after a failure (it needs every rank's optimizer partition): --resume continues from the last one")
		return nil
	}
	return c.save(step, models, pending)
}

// saveShards writes every rank's optimizer partitions into tmp (step-N.tmp): rank 0 makes the
// folders, each rank writes and syncs its own files, and all ranks meet again before rank 0 goes on
// to write the rest, the index and the manifest and to rename. Torch thread.
func (c *checkpointer) saveShards(tmp string, step int, models []*modelState) error {
	g := c.par.group()
	if g.Rank() == 0 {
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		for _, ms := range models {
			if err := os.MkdirAll(filepath.Join(tmp, ms.id), 0o755); err != nil {
				return err
			}
		}
	}
	if err := g.Barrier(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for _, ms := range models {
		if c.par.partition(ms.id) == nil {
			continue // rank 0 writes its whole state (an adapter trained alike on every rank)
		}
		path := filepath.Join(tmp, ms.id, rundir.OptimShardFile(g.Rank(), g.Size()))
		if err := c.par.writeOptim(ms.id, ms.opt, path, rundir.OptimMeta(step, ms.id, g.Rank(), g.Size())); err != nil {
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
