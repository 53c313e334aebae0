package config

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const searchMinimal = `
run: {dir: runs/x, steps: 5}
models:
  - {id: m, tokenizer: tok.json, init: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}}
agents:
  - {name: verifier, model: m}
  - {name: searcher, model: m}
  - {name: answerer, model: m}
orchestra: {type: search}
data: {train: train.jsonl}
retriever: {type: http, url: "http://127.0.0.1:8000/retrieve"}
`

// A duration takes a unit or a number of seconds; before, `timeout: 30` became 30 ns.
func TestDurationsNeedUnitsOrAreSeconds(t *testing.T) {
	for _, c := range []struct {
		val  string
		want time.Duration
	}{{"30", 30 * time.Second}, {"1.5", 1500 * time.Millisecond}, {"30s", 30 * time.Second}, {"2m", 2 * time.Minute}, {`"45"`, 45 * time.Second}} {
		cfg, err := Load(write(t, searchMinimal), []string{"retriever.timeout=" + c.val})
		if err != nil {
			t.Fatalf("timeout %s: %v", c.val, err)
		}
		if cfg.Retriever.Timeout != c.want {
			t.Errorf("timeout %s = %s, want %s", c.val, cfg.Retriever.Timeout, c.want)
		}
	}
	_, err := Load(write(t, searchMinimal), []string{"retriever.timeout=thirty"})
	if err == nil || !strings.Contains(err.Error(), "retriever.timeout") || !strings.Contains(err.Error(), "want a duration") {
		t.Errorf("timeout thirty: err %v", err)
	}
	_, err = Load(write(t, searchMinimal), []string{"retriever.timeout=0"})
	if err == nil || !strings.Contains(err.Error(), "retriever.timeout: must be in (0s, 1h]") {
		t.Errorf("timeout 0: err %v", err)
	}
}

// Whole numbers for integer keys, finite numbers everywhere, and no empty values.
func TestStrictValues(t *testing.T) {
	cases := []struct {
		name string
		sets []string
		env  map[string]string
		body string
		want []string
	}{
		{"fraction into int", []string{"run.steps=3.7"}, nil, "", []string{"run.steps: want a whole number, got 3.7", "--set run.steps=3.7"}},
		{"overflow", []string{"run.steps=1e30"}, nil, "", []string{"run.steps: 1e+30 does not fit a 64-bit integer"}},
		{"int overflow", []string{"run.seed=99999999999999999999"}, nil, "", []string{"run.seed:"}},
		{"empty set", []string{"run.steps="}, nil, "", []string{"--set run.steps=: empty value"}},
		{"null set", []string{"run.steps=~"}, nil, "", []string{"run.steps: no value", "--set run.steps=~"}},
		{"empty env", nil, map[string]string{"DRMAS_RUN_STEPS": ""}, "", []string{"DRMAS_RUN_STEPS: empty value"}},
		{"bad env", nil, map[string]string{"DRMAS_RUN_STEPS": "abc"}, "", []string{"run.steps: want 'int'", "environment DRMAS_RUN_STEPS=abc"}},
		{"null in file", nil, nil, minimal + "warmup: {lr: }\n", []string{"warmup.lr: no value"}},
		{"env typo", nil, map[string]string{"DRMAS_RUN_STEPZ": "3"}, "", []string{"DRMAS_RUN_STEPZ: no config key"}},
		{"env list typo", nil, map[string]string{"DRMAS_MODELS_0_OPTIM_LRR": "3"}, "", []string{"DRMAS_MODELS_0_OPTIM_LRR: no config key"}},
		{"env list range", nil, map[string]string{"DRMAS_MODELS_4_OPTIM_LR": "3"}, "", []string{"DRMAS_MODELS_4_OPTIM_LR: models: index \"4\" out of range"}},
		{"nan lr", []string{"models.0.optim.lr=.nan"}, nil, "", []string{"models[0].optim.lr: must be a finite number"}},
		{"inf min_std", []string{"algorithm.normalization.min_std=.inf"}, nil, "", []string{"algorithm.normalization.min_std: must be a finite number"}},
		{"nan kl", []string{"algorithm.kl.coef=.nan"}, nil, "", []string{"algorithm.kl.coef: must be a finite number"}},
		{"nan temperature", []string{"agents.0.sampling.temperature=.nan"}, nil, "", []string{"agents[0].sampling.temperature: must be a finite number"}},
		{"negative clip c", []string{"algorithm.clip_ratio_c=-1"}, nil, "", []string{"algorithm.clip_ratio_c: must be a finite number ≥ 1"}},
		{"clip c below 1", []string{"algorithm.clip_ratio_c=0.5"}, nil, "", []string{"algorithm.clip_ratio_c: must be a finite number ≥ 1"}},
		{"negative rope", []string{"models.0.init.rope_theta=-1"}, nil, "", []string{"models[0].init.rope_theta: must be a finite number > 0"}},
		{"nan role weight", []string{"agents.0.reward.role_weight=.nan"}, nil, "", []string{"agents[0].reward.role_weight: must be a finite number"}},
		{"huge hidden", []string{"models.0.init.hidden_size=10000000"}, nil, "", []string{"models[0].init.hidden_size: must be in [1, 65536]"}},
		{"max_new past positions", []string{"models.0.init.max_position_embeddings=64", "agents.0.sampling.max_new_tokens=64"}, nil, "", []string{"agents[0].sampling.max_new_tokens: 64 leaves no room"}},
		{"too many stops", []string{"agents.0.sampling.stop=[" + strings.Repeat("a,", 70) + "b]"}, nil, "", []string{"agents[0].sampling.stop: at most 64"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			body := c.body
			if body == "" {
				body = minimal
			}
			_, err := Load(write(t, body), c.sets)
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// An environment override reaches a list entry.
func TestEnvListEntries(t *testing.T) {
	t.Setenv("DRMAS_MODELS_0_OPTIM_LR", "0.5")
	t.Setenv("DRMAS_AGENTS_1_SAMPLING_TEMPERATURE", "0.25")
	t.Setenv("DRMAS_MODELS_0_INIT_ROPE_THETA", "500")
	cfg, err := Load(write(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Models[0].Optim.LR != 0.5 || *cfg.Agents[1].Sampling.Temperature != 0.25 || cfg.Models[0].Init.RopeTheta != 500 {
		t.Errorf("env list overrides not applied: lr %g temperature %v rope %g", cfg.Models[0].Optim.LR, cfg.Agents[1].Sampling.Temperature, cfg.Models[0].Init.RopeTheta)
	}
}

func TestGroupSizeOneWarns(t *testing.T) {
	cfg, err := Load(write(t, minimal), []string{"algorithm.group_size=1"})
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Warnings(); len(w) == 0 || !strings.Contains(w[0], "group_size is 1") {
		t.Errorf("warnings %q, want one about group_size 1", w)
	}
	cfg, _ = Load(write(t, minimal), nil)
	if w := cfg.Warnings(); len(w) != 0 {
		t.Errorf("warnings %q for a sound config", w)
	}
}

// top_p 0 means off here as in the policy and `drmas generate` (one owner: llm.Sampling.Check).
func TestTopPZeroIsOff(t *testing.T) {
	if _, err := Load(write(t, minimal), []string{"agents.0.sampling.top_p=0"}); err != nil {
		t.Errorf("top_p 0: %v", err)
	}
}

// A config that is not a regular file, or too big, is refused before reading it.
func TestConfigFileBounds(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", MaxFileSize)), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{fifo: "not a regular file", "/dev/zero": "not a regular file", dir: "not a regular file", big: "more than the"} {
		_, err := Load(path, nil)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", path, err, want)
		}
	}
}

// FuzzSetValue feeds arbitrary --set values to an integer, a number and a duration key: Load never
// panics, and a value it accepts is exactly the one written (no truncation, no default).
func FuzzSetValue(f *testing.F) {
	for _, s := range []string{"3", "3.7", "1e30", "", "~", ".nan", "-.inf", "0x10", "30s", "[1]", "{a: 1}", "'5'", "9223372036854775807"} {
		f.Add(s)
	}
	p := filepath.Join(f.TempDir(), "run.yaml")
	if err := os.WriteFile(p, []byte(searchMinimal), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, val string) {
		var parsed any
		yamlErr := yaml.Unmarshal([]byte(val), &parsed)
		if cfg, err := Load(p, []string{"run.steps=" + val}); err == nil {
			if yamlErr != nil || float64(cfg.Run.Steps) != toFloat(parsed) {
				t.Errorf("run.steps=%q loaded as %d (YAML %v)", val, cfg.Run.Steps, parsed)
			}
		}
		if cfg, err := Load(p, []string{"algorithm.kl.coef=" + val}); err == nil {
			c := cfg.Algorithm.KL.Coef
			if yamlErr != nil || math.IsNaN(c) || math.IsInf(c, 0) || c != toFloat(parsed) {
				t.Errorf("algorithm.kl.coef=%q loaded as %g (YAML %v)", val, c, parsed)
			}
		}
		if cfg, err := Load(p, []string{"retriever.timeout=" + val}); err == nil && cfg.Retriever.Timeout < time.Millisecond {
			t.Errorf("retriever.timeout=%q loaded as %s", val, cfg.Retriever.Timeout)
		}
	})
}

func toFloat(v any) float64 {
	if f, ok := number(v); ok {
		return f
	}
	return math.NaN()
}
