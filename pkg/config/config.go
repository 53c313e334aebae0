package config

import (
	"path/filepath"
	"time"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/toy"
	"github.com/drmas/drmas/pkg/judge"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/report"
	"github.com/drmas/drmas/pkg/rollout"
	"github.com/drmas/drmas/pkg/tool"
	"github.com/drmas/drmas/pkg/toolcall"
)

// Config is a whole run config.
type Config struct {
	Run       RunConfig           `mapstructure:"run"`
	Models    []ModelConfig       `mapstructure:"models"`
	Agents    []AgentConfig       `mapstructure:"agents"`
	Orchestra env.OrchestraConfig `mapstructure:"orchestra"`
	Data      DataConfig          `mapstructure:"data"`
	Toy       toy.Config          `mapstructure:"toy"`
	Retriever RetrieverConfig     `mapstructure:"retriever"`
	// Reward is where the team's outcome reward comes from: the orchestra's rule checker (type rule),
	// an LLM judge or a remote endpoint (pkg/judge, docs/rewards.md).
	Reward    judge.Config    `mapstructure:"reward"`
	Algorithm AlgorithmConfig `mapstructure:"algorithm"`
	Warmup    WarmupConfig    `mapstructure:"warmup"`
	Dist      dist.Config     `mapstructure:"dist"`
	Rollout   rollout.Config  `mapstructure:"rollout"`
	// Tools bounds the function tools of flow steps with tools and names the MCP servers that add
	// to the built-in ones (docs/tools.md).
	Tools tool.Config `mapstructure:"tools"`

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

// ModelConfig is one entry of `models:`; agents refer to it by ID.
type ModelConfig struct {
	ID        string        `mapstructure:"id"`
	Path      string        `mapstructure:"path"`      // Hugging Face model folder; empty = random init from Init
	Init      InitConfig    `mapstructure:"init"`      // architecture of a randomly initialised model
	Tokenizer string        `mapstructure:"tokenizer"` // tokenizer.json; empty = the one in Path
	Device    string        `mapstructure:"device"`    // empty = the --device flag
	DType     string        `mapstructure:"dtype"`     // float32 | bfloat16 | float16 | float64
	Optim     OptimConfig   `mapstructure:"optim"`
	Rollout   engine.Config `mapstructure:"rollout"` // where the model's agents generate
	// GradientCheckpointing keeps only each decoder layer's input during a training forward and
	// recomputes the layer in backward: activation memory of one layer instead of all of them.
	GradientCheckpointing bool `mapstructure:"gradient_checkpointing"`
	// MaxTokensPerMicroBatch is the model's token budget per training micro-batch (0 = the
	// algorithm's, algorithm.max_tokens_per_micro_batch).
	MaxTokensPerMicroBatch int `mapstructure:"max_tokens_per_micro_batch"`
	// Base makes the entry a LoRA adapter on the model entry of that id (issue #27, docs/lora.md):
	// the base is frozen and shared, the entry trains only its adapter's A and B matrices (LoRA),
	// with its own optimizer. An adapter has no path, init, tokenizer, dtype or device of its own.
	Base string     `mapstructure:"base"`
	LoRA LoRAConfig `mapstructure:"lora"` // the adapter's settings (with base only)
}

// IsAdapter says whether the entry is a LoRA adapter on another entry (base set).
func (m ModelConfig) IsAdapter() bool { return m.Base != "" }

// LoRAConfig is a LoRA adapter's shape: rank r, alpha (the low-rank term is scaled by alpha/r),
// dropout (0 only), the projections it adapts, and an optional PEFT adapter folder to start from.
type LoRAConfig struct {
	Rank          int      `mapstructure:"rank"`
	Alpha         float64  `mapstructure:"alpha"`
	Dropout       float64  `mapstructure:"dropout"`
	TargetModules []string `mapstructure:"target_modules"` // all-linear, or some of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
	Path          string   `mapstructure:"path"`           // a PEFT adapter folder (adapter_config.json, adapter_model.safetensors); "" = PEFT's init (B = 0: the base)
}

// InitConfig is the architecture of a randomly initialised model (Hugging Face config.json names).
type InitConfig struct {
	ModelType         string  `mapstructure:"model_type"` // one of arch.Names
	HiddenSize        int     `mapstructure:"hidden_size"`
	IntermediateSize  int     `mapstructure:"intermediate_size"` // 0 = 4 × hidden_size... rounded as Llama does
	NumHiddenLayers   int     `mapstructure:"num_hidden_layers"`
	NumAttentionHeads int     `mapstructure:"num_attention_heads"`
	NumKeyValueHeads  int     `mapstructure:"num_key_value_heads"`
	VocabSize         int     `mapstructure:"vocab_size"` // 0 = the tokenizer's size
	RopeTheta         float64 `mapstructure:"rope_theta"`
	TieWordEmbeddings bool    `mapstructure:"tie_word_embeddings"`
	MaxPosition       int     `mapstructure:"max_position_embeddings"`
	InitializerRange  float64 `mapstructure:"initializer_range"` // std of the normal init of weight matrices
}

// OptimConfig is a model's AdamW settings.
type OptimConfig struct {
	LR          float64   `mapstructure:"lr"`
	Betas       []float64 `mapstructure:"betas"`
	Eps         float64   `mapstructure:"eps"`
	WeightDecay float64   `mapstructure:"weight_decay"`
	WarmupSteps int       `mapstructure:"warmup_steps"` // linear learning-rate warm-up, in optimizer steps
	GradClip    float64   `mapstructure:"grad_clip"`    // total L2 norm; 0 = off
	// Offload is where the AdamW state lives: none (the model's device) or cpu (host memory: the
	// float32 master weights and moments, of the rank's partition under dist.shard, with the step
	// run there; docs/scale-out.md "Optimizer offload").
	Offload string `mapstructure:"offload"`
}

// AgentConfig is one entry of `agents:`: the env's agent settings plus per-agent training overrides.
type AgentConfig struct {
	env.AgentConfig `mapstructure:",squash"`
	Train           AgentTrainConfig `mapstructure:"train"`
}

// AgentTrainConfig overrides algorithm settings for one agent's share of the loss. Unset = the
// algorithm's value.
type AgentTrainConfig struct {
	LR *float64 `mapstructure:"lr"` // only for an agent whose model no other agent uses
	// GradClip overrides models[].optim.grad_clip for the agent's model; like lr, only for an agent
	// whose model no other agent uses (a shared model takes one clipped step for all its agents).
	GradClip       *float64 `mapstructure:"grad_clip"`
	EntropyCoef    *float64 `mapstructure:"entropy_coef"`
	KLCoef         *float64 `mapstructure:"kl_coef"`
	ClipRatioLow   *float64 `mapstructure:"clip_ratio_low"`
	ClipRatioHigh  *float64 `mapstructure:"clip_ratio_high"`
	MicroBatchSize int      `mapstructure:"micro_batch_size"` // 0 = the algorithm's
}

// DataConfig is the `data:` section: datasets on disk (a toy task generates its own, see Toy).
type DataConfig struct {
	Train  string     `mapstructure:"train"`
	Val    []string   `mapstructure:"val"`
	Fields DataFields `mapstructure:"fields"`
	Shape  string     `mapstructure:"shape"` // auto | gsm8k | math | qa | plain
	Limit  int        `mapstructure:"limit"` // questions read per file; 0 = all
	// MaxPromptLength bounds a rendered prompt in tokens (verl's max_prompt_length); 0 = the model's
	// context less the agent's max_new_tokens at load, and for the memory plan the prompts measured
	// on the data (pkg/train.MeasurePrompts: the longest first turn, later turns bounded by the
	// orchestra).
	MaxPromptLength int `mapstructure:"max_prompt_length"`
	// FilterOverlongPrompts skips (and counts) records whose prompt exceeds the bound instead of
	// refusing the dataset (verl's filter_overlong_prompts).
	FilterOverlongPrompts bool `mapstructure:"filter_overlong_prompts"`
}

// DataFields names the dataset fields (dotted paths allowed); empty = the shape's default.
type DataFields struct {
	ID       string `mapstructure:"id"`
	Question string `mapstructure:"question"`
	Answer   string `mapstructure:"answer"`
}

// RetrieverConfig is the `retriever:` section of the search orchestra.
type RetrieverConfig struct {
	Type     string        `mapstructure:"type"` // embedded | http | facts | none
	Corpus   string        `mapstructure:"corpus"`
	IndexDir string        `mapstructure:"index_dir"`
	URL      string        `mapstructure:"url"`
	Timeout  time.Duration `mapstructure:"timeout"`  // per attempt; a unit (30s) or a number of seconds
	Retries  int           `mapstructure:"retries"`  // tries at least
	Deadline time.Duration `mapstructure:"deadline"` // keep trying an unreachable server this long after the first try
}

// AlgorithmConfig is the `algorithm:` section: advantages and the policy loss.
type AlgorithmConfig struct {
	Normalization    NormalizationConfig `mapstructure:"normalization"`
	GroupSize        int                 `mapstructure:"group_size"`          // rollouts per task
	BatchSize        int                 `mapstructure:"batch_size"`          // tasks per iteration
	PPOMiniUpdateNum int                 `mapstructure:"ppo_mini_update_num"` // optimizer steps per epoch
	PPOEpochs        int                 `mapstructure:"ppo_epochs"`
	MicroBatchSize   int                 `mapstructure:"micro_batch_size"` // sequences per forward/backward
	// MaxTokensPerMicroBatch > 0 cuts each agent's calls into micro-batches by padded tokens instead
	// of by count: sorted by length and packed so that rows × the longest row stays within it (a
	// longer call is a micro-batch of its own; pkg/microbatch). 0 = micro_batch_size sequences each.
	MaxTokensPerMicroBatch int         `mapstructure:"max_tokens_per_micro_batch"`
	ClipRatioLow           float64     `mapstructure:"clip_ratio_low"`
	ClipRatioHigh          float64     `mapstructure:"clip_ratio_high"`
	ClipRatioC             float64     `mapstructure:"clip_ratio_c"` // dual clip; ≤ 1 = off
	LossAggMode            string      `mapstructure:"loss_agg_mode"`
	KL                     KLConfig    `mapstructure:"kl"`
	EntropyCoef            float64     `mapstructure:"entropy_coef"`
	MaxNonfiniteSteps      int         `mapstructure:"max_nonfinite_steps"` // abort after this many in a row
	Guard                  GuardConfig `mapstructure:"guard"`
	// RolloutCorrection weights each token's policy-gradient loss by the ratio of the trainer's
	// recomputed log-probs to the generator's (off-policy correction; docs/algorithm.md).
	RolloutCorrection CorrectionConfig `mapstructure:"rollout_correction"`
	// BalanceLossByAgentFreq weights each call's policy-gradient loss by (1/n)/mean(1/n), n the calls of
	// its agent in its prompt group, so that an agent called several times in a group weighs as much
	// as one called once (the Dr. MAS reference's balance_loss_by_agent_freq; docs/algorithm.md).
	BalanceLossByAgentFreq bool `mapstructure:"balance_loss_by_agent_freq"`
	// KLInReward subtracts β·Σₜ KL(π_old ‖ π_ref) from each call's score before advantages (verl's
	// use_kl_in_reward), β fixed or adaptive (docs/algorithm.md).
	KLInReward KLInRewardConfig `mapstructure:"kl_in_reward"`
	// FilterGroups drops the prompt groups whose calls all score alike (no advantage under any
	// estimator) and rolls out more tasks until the batch is full (DAPO's dynamic sampling).
	FilterGroups FilterGroupsConfig `mapstructure:"filter_groups"`
}

// FilterGroupsConfig is DAPO's dynamic sampling: with Enable, groups without signal are dropped and
// more batches of tasks rolled out, MaxDraws batches at most in all (DAPO's max_num_gen_batches).
type FilterGroupsConfig struct {
	Enable   bool `mapstructure:"enable"`
	MaxDraws int  `mapstructure:"max_draws"`
}

// KLInRewardConfig is the KL penalty in the reward: coef β (0 = off), the per-token estimator, and the
// controller: fixed, or adaptive towards target with horizon (verl's kl_ctrl; in sequences).
type KLInRewardConfig struct {
	Coef       float64 `mapstructure:"coef"`
	Type       string  `mapstructure:"type"`       // k1 (verl's kl) | k2 | k3 | low_var_kl
	Controller string  `mapstructure:"controller"` // fixed | adaptive
	Target     float64 `mapstructure:"target"`     // adaptive: the target KL per token
	Horizon    float64 `mapstructure:"horizon"`    // adaptive: in sequences
}

// KL-in-reward controllers.
const (
	KLControllerFixed    = "fixed"
	KLControllerAdaptive = "adaptive"
)

// CorrectionConfig is the off-policy correction: mode none | tis | token_mask | seq_mask | geo_mask,
// with the ratio threshold C (tis truncates at C; the masks keep ratios within [1/C, C]).
type CorrectionConfig struct {
	Mode      string  `mapstructure:"mode"`
	Threshold float64 `mapstructure:"threshold"`
}

// NormalizationConfig selects the advantage estimator: normalize's one spec type (a preset, explicit
// choices, ε / std / min_std and per-agent overrides). In YAML it is either a string (the preset) or
// a map of the fields.
type NormalizationConfig = normalize.Spec

// AgentNormalization is one per-agent estimator override: {name: searcher, preset: grpo}.
type AgentNormalization = normalize.AgentSpec

// GuardConfig is the online per-agent gradient guard: before each optimizer step, each agent's share
// of the gradient is compared with that agent's trailing median norm over the last Window steps.
type GuardConfig struct {
	Window int     `mapstructure:"window"` // trailing steps per agent; 0 = guard off
	Factor float64 `mapstructure:"factor"` // a share above factor × the trailing median is a spike
	Action string  `mapstructure:"action"` // log | clip | skip
}

// KLConfig is the optional KL penalty to a frozen reference (the model as it was at the start).
type KLConfig struct {
	Coef float64 `mapstructure:"coef"` // 0 = off (the paper's runs)
	Type string  `mapstructure:"type"` // k1 | k2 | k3 (low_var_kl)
}

// WarmupConfig is the supervised format warm-up run before RL (toy tasks, docs/toy-tasks.md).
type WarmupConfig struct {
	Steps     int     `mapstructure:"steps"`
	LR        float64 `mapstructure:"lr"`
	BatchSize int     `mapstructure:"batch_size"` // demonstrations per step
}

// Defaults returns the config that YAML is decoded over.
func Defaults() Config {
	return Config{
		Run:       RunConfig{Dir: "runs/default", Seed: 1, Steps: 200, SaveEvery: 50, KeepLast: 3, ValK: 4, Config: report.Config{TensorBoard: true}},
		Orchestra: env.DefaultOrchestraConfig(),
		Toy:       toy.Defaults(),
		Retriever: RetrieverConfig{Type: "", Timeout: 30 * time.Second, Retries: 3, Deadline: 2 * time.Minute},
		Reward:    judge.Defaults(),
		Algorithm: AlgorithmConfig{
			Normalization:    NormalizationConfig{Preset: "drmas", Eps: 1e-6},
			GroupSize:        8,
			BatchSize:        16,
			PPOMiniUpdateNum: 1,
			PPOEpochs:        1,
			MicroBatchSize:   16,
			ClipRatioLow:     0.2,
			ClipRatioHigh:    0.2,
			ClipRatioC:       3.0,
			LossAggMode:      "token-mean",
			KL:               KLConfig{Type: "k3"},
			EntropyCoef:      0,

			MaxNonfiniteSteps: 10,
			Guard:             GuardConfig{Window: 0, Factor: 5, Action: "log"},
			RolloutCorrection: CorrectionConfig{Mode: algo.CorrectionNone, Threshold: 2},
			KLInReward:        KLInRewardConfig{Type: algo.K1, Controller: KLControllerFixed, Target: 0.1, Horizon: 10000},
			FilterGroups:      FilterGroupsConfig{MaxDraws: 4},
		},
		Warmup: WarmupConfig{LR: 1e-3, BatchSize: 32},
		Dist:   dist.Defaults(),
	}
}

// DefaultModel is what each `models:` entry is decoded over.
func DefaultModel() ModelConfig {
	return ModelConfig{
		DType:   "float32",
		Init:    InitConfig{ModelType: "qwen2", RopeTheta: 10000, MaxPosition: 2048, TieWordEmbeddings: true, InitializerRange: 0.02},
		Optim:   OptimConfig{LR: 1e-6, Betas: []float64{0.9, 0.999}, Eps: 1e-8, WeightDecay: 0.01, GradClip: 1.0, Offload: algo.OffloadNone},
		Rollout: engine.Defaults(),
		LoRA:    LoRAConfig{Rank: 8, Alpha: 16, TargetModules: []string{arch.LoRAAllLinear}},
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
func (c *Config) WeightsOf(m ModelConfig) ModelConfig {
	if !m.IsAdapter() {
		return m
	}
	if b, ok := c.ModelByID(m.Base); ok {
		m.Path, m.Init, m.Tokenizer, m.DType, m.Device = b.Path, b.Init, b.Tokenizer, b.DType, b.Device
	}
	return m
}

// IsFrozenBase says whether the model entry id is the base of some adapter (and so frozen).
func (c *Config) IsFrozenBase(id string) bool { return len(c.AdaptersOf(id)) > 0 }

// ModelByID returns the model entry with the given id.
func (c *Config) ModelByID(id string) (ModelConfig, bool) {
	for _, m := range c.Models {
		if m.ID == id {
			return m, true
		}
	}
	return ModelConfig{}, false
}

// EnvAgents returns the agents' env settings, for building the orchestra. An agent without a
// tool_format gets its model family's (toolcall.FormatFor of the model_type), when one is known.
func (c *Config) EnvAgents() []env.AgentConfig {
	out := make([]env.AgentConfig, len(c.Agents))
	for i, a := range c.Agents {
		out[i] = a.AgentConfig
		if out[i].ToolFormat == "" {
			if f, err := toolcall.FormatFor(c.modelType(a.Model)); err == nil {
				out[i].ToolFormat = string(f)
			}
		}
	}
	return out
}

// modelType is the model_type of a model entry (an adapter's base's): from init, or from the
// config.json of its path ("" when unreadable).
func (c *Config) modelType(id string) string {
	m, ok := c.ModelByID(id)
	if !ok {
		return ""
	}
	m = c.WeightsOf(m)
	if m.Path == "" {
		return m.Init.ModelType
	}
	pc, err := arch.ReadConfig(filepath.Join(m.Path, "config.json"))
	if err != nil {
		return ""
	}
	return pc.ModelType
}

// IsToy reports whether the run's data is a generated toy task.
func (c *Config) IsToy() bool { return c.Toy.Task != "" }

// EngineOf is the rollout section model m samples under: an adapter's base's (its engine serves the
// base and loads the adapter on it), m's own otherwise.
func (c *Config) EngineOf(m ModelConfig) engine.Config {
	if b, ok := c.ModelByID(m.Base); ok && m.IsAdapter() {
		return b.Rollout
	}
	return m.Rollout
}
