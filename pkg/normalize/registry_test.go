package normalize_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/normalize"
)

// A new estimator preset is its options function plus one registration line in normalize: the run
// config, the estimator specs of drmas estimators and the spec type drmas advantages builds all take
// it with no change elsewhere (pkg/config asks normalize.Presets).
func TestNewPresetNeedsOneRegistration(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.yaml")
	yaml := strings.ReplaceAll(`run: {dir: DIR/run}
models:
  - {id: small, tokenizer: tok.json, init: {hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2}}
agents:
  - {name: solver, model: small}
  - {name: verifier, model: small}
orchestra: {type: math}
toy: {task: toy-math}
algorithm: {normalization: {preset: drmas-population, agents: [{name: verifier, preset: drmas-population}]}}
`, "DIR", dir)
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(path, nil); err == nil || !strings.Contains(err.Error(), `"drmas-population"`) {
		t.Fatalf("before registering: %v, want the unknown preset named", err)
	}

	population := func() normalize.Options { o := normalize.DrMAS(); o.Unbiased = false; return o }
	normalize.AddPresetForTest(t, "drmas-population", population)

	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatalf("config with the new preset: %v", err)
	}
	o, err := cfg.Algorithm.Normalization.Options()
	if err != nil {
		t.Fatal(err)
	}
	if o.Mean != normalize.Agent || !o.Unbiased || o.Agents["verifier"].Mean != normalize.Agent {
		// Unbiased comes from the spec's population_std (false), as for every preset.
		t.Errorf("resolved %s", o)
	}
	e, err := normalize.ParseEstimator("grpo+solver=drmas-population", normalize.DrMAS())
	if err != nil || e.Options.Agents["solver"].Mean != normalize.Agent {
		t.Errorf("estimator spec: %v %v", e.Options, err)
	}
}
