package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/files"
	"github.com/drmas/drmas/pkg/policy"
)

// ErrResumeMismatch is returned when --resume is given a config whose team or model shapes differ
// from those the checkpoint was trained with.
var ErrResumeMismatch = errors.New("the config does not match the checkpoint")

// verifyCheckpoint checks that the checkpoint of step is complete, without loading it. Its manifest
// (manifest.go) must agree with the folder's name and with every file, sizes and CRC-32C; and, with
// or without a manifest, trainer.json must be an object whose step is the folder's, config.yaml must
// parse, every model of that config must have its weights, config.json and optimizer state, every
// JSON file must parse and every safetensors file must hold all the bytes its header promises.
//
// A checkpoint without a manifest (written by a drmas from before manifests) is complete when all
// of the rest holds; legacy reports that, so the caller can say no checksum vouched for it.
func verifyCheckpoint(ck string, step int) (legacy bool, err error) {
	m, err := readManifest(ck, step)
	switch {
	case errors.Is(err, errNoManifest):
		legacy = true
	case err != nil:
		return false, err
	default:
		if err := checkManifest(ck, m); err != nil {
			return false, err
		}
	}
	st, err := readTrainerState(ck, step)
	if err != nil {
		return legacy, err
	}
	if m != nil && max(st.WorldSize, 1) != m.WorldSize {
		return legacy, fmt.Errorf("%s: world_size %d, %s says %d", filepath.Join(ck, "trainer.json"), st.WorldSize, ManifestFile, m.WorldSize)
	}
	cfgPath := filepath.Join(ck, "config.yaml")
	if _, err := files.Read(cfgPath, files.MaxConfig); err != nil {
		return legacy, err
	}
	cfg, err := config.ReadResolved(cfgPath)
	if err != nil {
		return legacy, err
	}
	for _, mc := range cfg.Models {
		if cfg.IsFrozenBase(mc.ID) { // weights only: no optimizer state
			if p := filepath.Join(ck, mc.ID, "config.json"); !regularFile(p) {
				return legacy, fmt.Errorf("%s: missing (frozen base %s's config.json)", p, mc.ID)
			}
			if err := checkWeightFiles(filepath.Join(ck, mc.ID)); err != nil {
				return legacy, err
			}
			continue
		}
		weights := []string{"config.json", "optim.json"}
		if mc.IsAdapter() {
			weights = []string{policy.AdapterConfigFile, policy.AdapterWeightsFile, "optim.json"}
		}
		for _, name := range weights {
			if p := filepath.Join(ck, mc.ID, name); !regularFile(p) {
				return legacy, fmt.Errorf("%s: missing (model %s's %s)", p, mc.ID, name)
			}
		}
		// The optimizer state: optim.safetensors, or a sharded run's partitions and their index.
		if _, sharded, err := readOptimIndex(filepath.Join(ck, mc.ID)); err != nil {
			return legacy, err
		} else if p := filepath.Join(ck, mc.ID, "optim.safetensors"); !sharded && !regularFile(p) {
			return legacy, fmt.Errorf("%s: missing (model %s's optim.safetensors, and no %s)", p, mc.ID, optimIndexFile)
		}
		if mc.IsAdapter() {
			continue
		}
		if err := checkWeightFiles(filepath.Join(ck, mc.ID)); err != nil {
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
			return policy.CheckSafetensors(path)
		}
		return nil
	})
}

func regularFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// checkWeightFiles checks that a model folder holds its weights: model.safetensors, or, for a model
// saved in shards (pkg/policy/weights.go SaveSharded), model.safetensors.index.json and every shard it
// names.
func checkWeightFiles(dir string) error {
	if regularFile(filepath.Join(dir, "model.safetensors")) {
		return nil
	}
	index := filepath.Join(dir, "model.safetensors.index.json")
	if !regularFile(index) {
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
		if !filepath.IsLocal(shard) || !regularFile(filepath.Join(dir, shard)) {
			return fmt.Errorf("%s: missing (a shard %s names)", filepath.Join(dir, shard), index)
		}
	}
	return nil
}

// readTrainerState reads a checkpoint's trainer.json and checks it against the folder's step: a JSON
// object (not null), with a step, the folder's, and a world size that is not negative. Anything else
// is damage, never "step 0".
func readTrainerState(ck string, step int) (trainerState, error) {
	var st trainerState
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
		return st, fmt.Errorf("%s: step %d, but the folder is %s%d", path, st.Step, stepPrefix, step)
	case st.WorldSize < 0:
		return st, fmt.Errorf("%s: world_size %d is negative", path, st.WorldSize)
	}
	return st, nil
}

// checkResumable compares the config with the one the checkpoint was saved with: the same agents
// on the same models, and for each model the same source (path) and, for a random model, the same
// architecture. Anything else would train weights of one shape under a config that records another.
func checkResumable(cfg *config.Config, ck string) error {
	old, err := config.ReadResolved(filepath.Join(ck, "config.yaml"))
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	var diffs []string
	team := func(c *config.Config) []string {
		var out []string
		for _, a := range c.Agents {
			out = append(out, a.Name+"→"+a.Model)
		}
		slices.Sort(out)
		return out
	}
	if a, b := team(old), team(cfg); !slices.Equal(a, b) {
		diffs = append(diffs, fmt.Sprintf("agents (name→model): checkpoint %s, config %s", strings.Join(a, ", "), strings.Join(b, ", ")))
	}
	if old.Orchestra.Type != cfg.Orchestra.Type {
		diffs = append(diffs, fmt.Sprintf("orchestra.type: checkpoint %s, config %s", old.Orchestra.Type, cfg.Orchestra.Type))
	}
	for _, m := range cfg.Models {
		om, ok := old.ModelByID(m.ID)
		if !ok {
			diffs = append(diffs, fmt.Sprintf("model %q is not in the checkpoint", m.ID))
			continue
		}
		if om.Path != m.Path {
			diffs = append(diffs, fmt.Sprintf("model %s path: checkpoint %q, config %q", m.ID, om.Path, m.Path))
		}
		if om.Base != m.Base {
			diffs = append(diffs, fmt.Sprintf("model %s base: checkpoint %q, config %q", m.ID, om.Base, m.Base))
		}
		if m.IsAdapter() {
			ol := om.LoRA
			ol.Path, ol.Dropout = m.LoRA.Path, m.LoRA.Dropout // a starting point and dropout 0 do not change the shape
			diffs = append(diffs, fieldDiffs("model "+m.ID+" lora.", ol, m.LoRA)...)
			continue
		}
		if m.Path == "" {
			diffs = append(diffs, fieldDiffs("model "+m.ID+" init.", om.Init, m.Init)...)
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%w %s: %s. Resume with the checkpoint's settings, or start a new run (another run.dir, or --force)",
		ErrResumeMismatch, ck, strings.Join(diffs, "; "))
}

// fieldDiffs lists the fields (by config key) whose values differ between two structs of a type.
func fieldDiffs(prefix string, a, b any) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := 0; i < va.NumField(); i++ {
		x, y := va.Field(i).Interface(), vb.Field(i).Interface()
		if !reflect.DeepEqual(x, y) {
			key := strings.Split(va.Type().Field(i).Tag.Get("mapstructure"), ",")[0]
			out = append(out, fmt.Sprintf("%s%s: checkpoint %v, config %v", prefix, key, x, y))
		}
	}
	return out
}
