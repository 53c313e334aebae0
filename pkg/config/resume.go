package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// ErrResumeMismatch is returned when --resume is given a config whose team or model shapes differ
// from those the checkpoint was trained with.
var ErrResumeMismatch = errors.New("the config does not match the checkpoint")

// CheckResumable compares the config with the one the checkpoint ck was saved with (its
// config.yaml): the same agents on the same models, and for each model the same source (path) and,
// for a random model, the same architecture. Anything else would train weights of one shape under a
// config that records another.
func (cfg *Config) CheckResumable(ck string) error {
	old, err := ReadResolved(filepath.Join(ck, "config.yaml"))
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	var diffs []string
	team := func(c *Config) []string {
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
