package policy

import "github.com/drmas/drmas/pkg/policy/modeltype"

import "errors"

// Qwen3 is the model_type of the dense Qwen3 models.
var Qwen3 = modeltype.Qwen3

// qwen3 is the Llama block with an RMSNorm over each query and key head before the rotary
// embeddings (q_norm, k_norm) and an explicit head_dim. Sliding-window attention
// (use_sliding_window) is rejected.
var qwen3 = family{
	modelType:    Qwen3,
	architecture: "Qwen3ForCausalLM",
	defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 32768
		}
	},
	check:   func(c Config) error { return errors.Join(checkSiLU(c), noSlidingWindow(c)) },
	options: func(c Config, o *options) { o.qkNorm = true },
	layer:   newDecoderLayer,
}
