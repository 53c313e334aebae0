package train

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// A checkpoint is a folder <run>/step-N holding, per model, a Hugging Face model folder <id>/ (config.json,
// model.safetensors, tokenizer files) with the optimizer state beside it (optim.safetensors,
// optim.json), plus trainer.json and the resolved config.yaml. It is written as step-N.tmp and renamed,
// so a crash never leaves a half checkpoint as the latest.

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
}

type optimState struct {
	Step int     `json:"step"`
	LR   float64 `json:"lr"`
}

const stepPrefix = "step-"

// CheckpointDir is the folder of the checkpoint taken after iteration step.
func CheckpointDir(runDir string, step int) string {
	return filepath.Join(runDir, stepPrefix+strconv.Itoa(step))
}

// latestCheckpoint returns the newest complete checkpoint of a run ("" if none).
func latestCheckpoint(runDir string) (string, error) {
	steps, err := checkpointSteps(runDir)
	if err != nil || len(steps) == 0 {
		return "", err
	}
	return CheckpointDir(runDir, steps[len(steps)-1]), nil
}

// checkpointSteps lists the steps of the complete checkpoints, ascending.
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
		if err != nil {
			continue // step-N.tmp and others
		}
		if _, err := os.Stat(filepath.Join(runDir, e.Name(), "trainer.json")); err == nil {
			steps = append(steps, s)
		}
	}
	sort.Ints(steps)
	return steps, nil
}

// save writes the checkpoint of the last completed iteration and prunes old ones. Torch thread.
func (t *Trainer) save() error {
	if t.group.Rank() != 0 {
		return nil // data-parallel: rank 0 writes
	}
	began := time.Now()
	final := CheckpointDir(t.dir, t.step)
	tmp := final + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	for _, ms := range t.models {
		dir := filepath.Join(tmp, ms.id)
		if err := ms.pol.Save(dir); err != nil {
			return fmt.Errorf("checkpoint %s: %w", ms.id, err)
		}
		if err := saveOptim(ms.opt, dir); err != nil {
			return fmt.Errorf("checkpoint %s: optimizer: %w", ms.id, err)
		}
	}
	st := trainerState{Step: t.step, Seed: t.Config.Run.Seed, Saved: time.Now().UTC(), Streaks: map[string]int{}, WorldSize: t.group.Size()}
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
	if err := os.RemoveAll(final); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	log.Info().Int("step", t.step).Str("dir", final).Dur("took", time.Since(began).Round(time.Millisecond)).Msg("checkpoint saved")
	return t.prune()
}

// prune keeps the newest keep_last checkpoints (step-0, the post-warm-up weights, counts like any other).
func (t *Trainer) prune() error {
	keep := t.Config.Run.KeepLast
	if keep <= 0 {
		return nil
	}
	steps, err := checkpointSteps(t.dir)
	if err != nil {
		return err
	}
	for len(steps) > keep {
		if err := os.RemoveAll(CheckpointDir(t.dir, steps[0])); err != nil {
			return err
		}
		steps = steps[1:]
	}
	return nil
}

func saveOptim(o *AdamW, dir string) error {
	names, tensors := optimTensors(o)
	if err := policy.SaveTensors(filepath.Join(dir, "optim.safetensors"), names, tensors); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(optimState{Step: o.Step, LR: o.LR}, "", "  ")
	return os.WriteFile(filepath.Join(dir, "optim.json"), b, 0o644)
}

func loadOptim(o *AdamW, dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "optim.json"))
	if err != nil {
		return err
	}
	var st optimState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "optim.json"), err)
	}
	o.Step = st.Step
	names, tensors := optimTensors(o)
	return policy.LoadTensorsInto(filepath.Join(dir, "optim.safetensors"), names, tensors)
}

// optimTensors lists the optimizer state under the names optim.safetensors uses.
func optimTensors(o *AdamW) ([]string, []*ts.Tensor) {
	var names []string
	var tensors []*ts.Tensor
	for i, n := range o.Names {
		names = append(names, "exp_avg."+n, "exp_avg_sq."+n)
		tensors = append(tensors, o.M[i], o.V[i])
		if o.Master[i] != nil {
			names = append(names, "master."+n)
			tensors = append(tensors, o.Master[i])
		}
	}
	return names, tensors
}

// restore continues from a checkpoint: the models were loaded from it by buildModels; this restores
// the optimizers, the trainer state and the metrics file.
func (t *Trainer) restore(ck string) error {
	b, err := os.ReadFile(filepath.Join(ck, "trainer.json"))
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	var st trainerState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("resume: %s: %w", filepath.Join(ck, "trainer.json"), err)
	}
	if err := checkWorldSize(st.WorldSize, t.group.Size()); err != nil {
		return fmt.Errorf("resume from %s: %w", ck, err)
	}
	err = torch.Do(func() error {
		for _, ms := range t.models {
			if err := loadOptim(ms.opt, filepath.Join(ck, ms.id)); err != nil {
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
	for _, ms := range t.models {
		if ms.ref != nil {
			if err := ms.ref.Model.Save(filepath.Join(t.referenceDir(), ms.id)); err != nil {
				return fmt.Errorf("KL reference %s: %w", ms.id, err)
			}
		}
	}
	return nil
}

// loadReference reloads the KL reference weights of a resumed run.
func (t *Trainer) loadReference() error {
	for _, ms := range t.models {
		if !ms.usesKL() {
			continue
		}
		m, err := policy.Load(filepath.Join(t.referenceDir(), ms.id), ms.pol.Model.Device(), ms.pol.Model.DType())
		if err != nil {
			return fmt.Errorf("resume: KL reference of %s: %w", ms.id, err)
		}
		if ms.ref, err = policy.NewPolicy(ms.id+"-ref", m, ms.pol.Tok, ms.pol.Chat); err != nil {
			return err
		}
	}
	return nil
}
