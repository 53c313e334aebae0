// Package model is a `models:` entry of a run config: where a model's weights come from (a Hugging
// Face folder, or a random initialisation of an architecture), its dtype and device, its optimizer,
// where its agents sample (pkg/engine's section) and, for a LoRA adapter, its base and shape. It is
// pure Go: pkg/config assembles the entries, pkg/train loads them on pkg/policy.
package model

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/engine"
)

// Config is one entry of `models:`; agents refer to it by ID.
type Config struct {
	ID        string        `mapstructure:"id"`
	Path      string        `mapstructure:"path"`      // Hugging Face model folder; empty = random init from Init
	Init      Init          `mapstructure:"init"`      // architecture of a randomly initialised model
	Tokenizer string        `mapstructure:"tokenizer"` // tokenizer.json; empty = the one in Path
	Device    string        `mapstructure:"device"`    // empty = the --device flag
	DType     string        `mapstructure:"dtype"`     // float32 | bfloat16 | float16 | float64
	Optim     Optim         `mapstructure:"optim"`
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
	Base string `mapstructure:"base"`
	LoRA LoRA   `mapstructure:"lora"` // the adapter's settings (with base only)
}

// LoRA is a LoRA adapter's shape: rank r, alpha (the low-rank term is scaled by alpha/r),
// dropout (0 only), the projections it adapts, and an optional PEFT adapter folder to start from.
type LoRA struct {
	Rank          int      `mapstructure:"rank"`
	Alpha         float64  `mapstructure:"alpha"`
	Dropout       float64  `mapstructure:"dropout"`
	TargetModules []string `mapstructure:"target_modules"` // all-linear, or some of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
	Path          string   `mapstructure:"path"`           // a PEFT adapter folder (adapter_config.json, adapter_model.safetensors); "" = PEFT's init (B = 0: the base)
}

// Init is the architecture of a randomly initialised model (Hugging Face config.json names).
type Init struct {
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
	// The sparse MLP of model_type qwen3_moe (init.go); unset keys take transformers' defaults.
	MoE InitMoE `mapstructure:",squash"`
}

// Optim is a model's AdamW settings.
type Optim struct {
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

// Defaults is what each `models:` entry is decoded over.
func Defaults() Config {
	return Config{
		DType:   "float32",
		Init:    Init{ModelType: "qwen2", RopeTheta: 10000, MaxPosition: 2048, TieWordEmbeddings: true, InitializerRange: 0.02},
		Optim:   Optim{LR: 1e-6, Betas: []float64{0.9, 0.999}, Eps: 1e-8, WeightDecay: 0.01, GradClip: 1.0, Offload: algo.OffloadNone},
		Rollout: engine.Defaults(),
		LoRA:    LoRA{Rank: 8, Alpha: 16, TargetModules: []string{arch.LoRAAllLinear}},
	}
}

// IsAdapter says whether the entry is a LoRA adapter on another entry (base set).
func (m Config) IsAdapter() bool { return m.Base != "" }

// ModelType is the entry's model_type: from init, or from the config.json of its path ("" when
// unreadable). An adapter's is its base's (pkg/config's WeightsOf gives the base's path and init).
func (m Config) ModelType() string {
	if m.Path == "" {
		return m.Init.ModelType
	}
	pc, err := arch.ReadConfig(filepath.Join(m.Path, "config.json"))
	if err != nil {
		return ""
	}
	return pc.ModelType
}

// Outer lists the adapter's targets outside the decoder layers (embed_tokens, lm_head): PEFT's
// embedding and output LoRA, which some engines do not serve.
func (l LoRA) Outer() []string {
	var out []string
	for _, t := range l.TargetModules {
		if t == arch.LoRAEmbed || t == arch.LoRAHead {
			out = append(out, t)
		}
	}
	return out
}

// DTypes are the dtypes a model may train in.
var DTypes = arch.DTypeNames()

// deviceRE is a device a model may run on.
var deviceRE = regexp.MustCompile(`^(|auto|cpu|cuda|cuda:\d+)$`)

// Validate checks a full model's own settings (not an adapter's: ValidateAdapter), each problem
// naming its key under key ("models[0]").
func (m Config) Validate(key string) error {
	var ck choice.Problems
	ck.IntIn(key+".max_tokens_per_micro_batch", m.MaxTokensPerMicroBatch, 0, 1<<30)
	ck.OneOf(key+".dtype", m.DType, DTypes)
	if !deviceRE.MatchString(m.Device) {
		ck.Bad(key+".device", "must be auto, cpu, cuda or cuda:N (got %q)", m.Device)
	}
	if m.Path == "" {
		if m.Tokenizer == "" {
			ck.Bad(key+".tokenizer", "required when path is empty (a random model needs a tokenizer.json)")
		}
		m.Init.check(&ck, key+".init")
	}
	m.Optim.check(&ck, key+".optim")
	ck.Add(m.Rollout.Validate(key + ".rollout"))
	return ck.Err()
}

// ValidateAdapter checks an adapter entry's own settings (base set): a shape pkg/policy trains, no
// weights or tokenizer of its own, its rollouts where its base's are. That its base is a full model
// entry is the whole config's to check.
func (m Config) ValidateAdapter(key string) error {
	var ck choice.Problems
	ck.IntIn(key+".max_tokens_per_micro_batch", m.MaxTokensPerMicroBatch, 0, 1<<30)
	if m.Path != "" {
		ck.Bad(key+".path", "an adapter has no weights of its own (set lora.path to start from a PEFT adapter folder)")
	}
	if m.Tokenizer != "" {
		ck.Bad(key+".tokenizer", "an adapter uses its base's tokenizer")
	}
	l := m.LoRA
	ck.IntIn(key+".lora.rank", l.Rank, 1, 1<<12)
	ck.Positive(key+".lora.alpha", l.Alpha)
	if l.Dropout != 0 {
		ck.Bad(key+".lora.dropout", "%v: only 0 is supported (drmas trains LoRA adapters without dropout)", l.Dropout)
	}
	if len(l.TargetModules) == 0 {
		ck.Bad(key+".lora.target_modules", "none given (want %s or some of %s)", arch.LoRAAllLinear, strings.Join(arch.LoRAModules, ", "))
	}
	for i, t := range l.TargetModules {
		if t != arch.LoRAAllLinear && !slices.Contains(arch.LoRAModules, t) {
			ck.Bad(fmt.Sprintf("%s.lora.target_modules[%d]", key, i), "%q is not a module an adapter can target (want %s or some of %s)", t, arch.LoRAAllLinear, strings.Join(arch.LoRAModules, ", "))
		}
	}
	m.Optim.check(&ck, key+".optim")
	ck.Add(m.Rollout.Validate(key + ".rollout"))
	if m.Rollout.Served() {
		ck.Bad(key+".rollout.engine", "%s: an adapter's rollouts run where its base's do (set rollout on model %q: the engine serves the base and loads every adapter on it)", m.Rollout.Engine, m.Base)
	}
	return ck.Err()
}

// check checks the architecture of a randomly initialised model.
func (in Init) check(ck *choice.Problems, key string) {
	ck.Registered(key+".model_type", in.ModelType, arch.Names)
	for k, v := range map[string]int{"hidden_size": in.HiddenSize, "num_hidden_layers": in.NumHiddenLayers,
		"num_attention_heads": in.NumAttentionHeads, "max_position_embeddings": in.MaxPosition} {
		ck.IntIn(key+"."+k, v, 1, arch.MaxSizes[k])
	}
	for k, v := range map[string]int{"vocab_size": in.VocabSize, "intermediate_size": in.IntermediateSize} {
		ck.IntIn(key+"."+k, v, 0, arch.MaxSizes[k]) // 0 = derived
	}
	ck.IntIn(key+".num_key_value_heads", in.NumKeyValueHeads, 0, arch.MaxSizes["num_attention_heads"])
	if in.NumAttentionHeads > 0 && in.HiddenSize%in.NumAttentionHeads != 0 {
		ck.Bad(key+".hidden_size", "%d is not a multiple of num_attention_heads %d", in.HiddenSize, in.NumAttentionHeads)
	}
	if kv := in.NumKeyValueHeads; kv > 0 && in.NumAttentionHeads%kv != 0 {
		ck.Bad(key+".num_key_value_heads", "%d does not divide num_attention_heads %d", kv, in.NumAttentionHeads)
	}
	ck.Positive(key+".rope_theta", in.RopeTheta)
	ck.Positive(key+".initializer_range", in.InitializerRange)
	in.MoE.check(ck, key, in.ModelType)
}

// check checks the AdamW settings.
func (o Optim) check(ck *choice.Problems, key string) {
	ck.Positive(key+".lr", o.LR)
	if len(o.Betas) != 2 || !(o.Betas[0] >= 0 && o.Betas[0] < 1) || !(o.Betas[1] >= 0 && o.Betas[1] < 1) {
		ck.Bad(key+".betas", "want two values in [0, 1), got %v", o.Betas)
	}
	ck.Positive(key+".eps", o.Eps)
	ck.NonNeg(key+".weight_decay", o.WeightDecay)
	ck.AtLeast(key+".warmup_steps", o.WarmupSteps, 0)
	ck.NonNeg(key+".grad_clip", o.GradClip)
	ck.Registered(key+".offload", o.Offload, algo.OffloadModes)
}
