package arch

import "errors"

// Qwen3 is the model_type of the dense Qwen3 models.
const Qwen3 = "qwen3"

// qwen3 is the Llama block with an RMSNorm over each query and key head before the rotary
// embeddings (q_norm, k_norm) and an explicit head_dim. Sliding-window attention
// (use_sliding_window) is rejected.
var qwen3 = Family{
	ModelType:    Qwen3,
	Architecture: "Qwen3ForCausalLM",
	Defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 32768
		}
	},
	Check:   func(c Config) error { return errors.Join(checkSiLU(c), noSlidingWindow(c)) },
	Options: func(c Config, o *Options) { o.QKNorm = true },
}
