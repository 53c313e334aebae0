package policy

import "github.com/drmas/drmas/pkg/policy/modeltype"

import "errors"

// Qwen2 is the model_type of Qwen2 and Qwen2.5.
var Qwen2 = modeltype.Qwen2

// qwen2 is the Llama block with biases on q/k/v (always) and none on o_proj or the MLP.
// Sliding-window attention (use_sliding_window) is rejected.
var qwen2 = family{
	modelType:    Qwen2,
	architecture: "Qwen2ForCausalLM",
	defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 32768
		}
	},
	check:   func(c Config) error { return errors.Join(checkSiLU(c), noSlidingWindow(c)) },
	options: func(c Config, o *options) { o.qkvBias, o.oBias = true, false },
	layer:   newDecoderLayer,
}
