package config

import (
	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/report"
	"github.com/drmas/drmas/pkg/rollout"
	"github.com/drmas/drmas/pkg/team"
)

// Config is a whole run config, assembled from the sections its components own: the models
// (pkg/model, each with pkg/engine's rollout section), the team and its world (pkg/team: agents,
// orchestra, data, toy, retriever, reward, tools), the algorithm (pkg/algo), the rollout source
// (pkg/rollout), data parallelism (pkg/dist) and the reporter's keys of run (pkg/report).
type Config struct {
	Run         RunConfig      `mapstructure:"run"`
	Models      []model.Config `mapstructure:"models"`
	team.Config `mapstructure:",squash"`
	Algorithm   algo.Config    `mapstructure:"algorithm"`
	Warmup      WarmupConfig   `mapstructure:"warmup"`
	Dist        dist.Config    `mapstructure:"dist"`
	Rollout     rollout.Config `mapstructure:"rollout"`

	// Source is the file the config was read from (not a key).
	Source string `mapstructure:"-"`
}

// RunConfig is the `run:` section: where and how long.
type RunConfig struct {
	Dir        string `mapstructure:"dir"`         // run folder: metrics.jsonl, checkpoints, rollouts
	Seed       int64  `mapstructure:"seed"`        // seeds model init, data order and sampling
	Steps      int    `mapstructure:"steps"`       // training iterations
	SaveEvery  int    `mapstructure:"save_every"`  // checkpoint every N iterations (and at the end); 0 = end only
	KeepLast   int    `mapstructure:"keep_last"`   // checkpoints kept; 0 = all
	TestFreq   int    `mapstructure:"test_freq"`   // validate every N iterations (and at the end); 0 = never
	ValK       int    `mapstructure:"val_k"`       // samples per validation question (avg@k, pass@k)
	ValLimit   int    `mapstructure:"val_limit"`   // validation questions per dataset; 0 = all
	Threads    int    `mapstructure:"threads"`     // libtorch intra-op threads and the matrix products' threads; 0 = the defaults (docs/performance.md)
	MaxMinutes int    `mapstructure:"max_minutes"` // stop (checkpointing) after this wall time; 0 = no limit
	// The reporter's keys (dump_every, tensorboard, peak_tflops): pkg/report.
	report.Config `mapstructure:",squash"`
}

// WarmupConfig is the supervised format warm-up run before RL (toy tasks, docs/toy-tasks.md).
type WarmupConfig struct {
	Steps     int     `mapstructure:"steps"`
	LR        float64 `mapstructure:"lr"`
	BatchSize int     `mapstructure:"batch_size"` // demonstrations per step
}

// Defaults returns the config that YAML is decoded over (each `models:` entry over model.Defaults).
func Defaults() Config {
	return Config{
		Run:       RunConfig{Dir: "runs/default", Seed: 1, Steps: 200, SaveEvery: 50, KeepLast: 3, ValK: 4, Config: report.Config{TensorBoard: true}},
		Config:    team.Defaults(),
		Algorithm: algo.Defaults(),
		Warmup:    WarmupConfig{LR: 1e-3, BatchSize: 32},
		Dist:      dist.Defaults(),
	}
}

// AdaptersOf returns the adapters (entries with base: id) on the model entry id, in config order.
func (c *Config) AdaptersOf(id string) []string {
	var out []string
	for _, m := range c.Models {
		if m.Base == id && id != "" {
			out = append(out, m.ID)
		}
	}
	return out
}

// WeightsOf is m with the weights, tokenizer, architecture, dtype and device it runs with: for an
// adapter its base's path, init, tokenizer, dtype and device (its own id, lora and training
// settings kept); m itself otherwise.
func (c *Config) WeightsOf(m model.Config) model.Config {
	if !m.IsAdapter() {
		return m
	}
	if b, ok := c.ModelByID(m.Base); ok {
		m.Path, m.Init, m.Tokenizer, m.DType, m.Device = b.Path, b.Init, b.Tokenizer, b.DType, b.Device
	}
	return m
}

// SampledBy is the model entry whose engine samples m: an adapter's base (its engine serves the
// base and loads the adapter on it), m itself otherwise.
func (c *Config) SampledBy(m model.Config) model.Config {
	if b, ok := c.ModelByID(m.Base); ok && m.IsAdapter() {
		return b
	}
	return m
}

// IsFrozenBase says whether the model entry id is the base of some adapter (and so frozen).
func (c *Config) IsFrozenBase(id string) bool { return len(c.AdaptersOf(id)) > 0 }

// ModelByID returns the model entry with the given id.
func (c *Config) ModelByID(id string) (model.Config, bool) {
	for _, m := range c.Models {
		if m.ID == id {
			return m, true
		}
	}
	return model.Config{}, false
}

// ModelType is the model_type of model entry id (an adapter's base's; "" when unknown): what an
// agent's default tool_format follows (team.Config.EnvAgents).
func (c *Config) ModelType(id string) string {
	m, ok := c.ModelByID(id)
	if !ok {
		return ""
	}
	return c.WeightsOf(m).ModelType()
}
