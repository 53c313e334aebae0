package arch

import "errors"

// Qwen2 is the model_type of Qwen2 and Qwen2.5.
const Qwen2 = "qwen2"

// qwen2 is the Llama block with biases on q/k/v (always) and none on o_proj or the MLP.
// Sliding-window attention (use_sliding_window) is rejected.
var qwen2 = Family{
	ModelType:    Qwen2,
	Architecture: "Qwen2ForCausalLM",
	Defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 32768
		}
	},
	Check:   func(c Config) error { return errors.Join(checkSiLU(c), noSlidingWindow(c)) },
	Options: func(c Config, o *Options) { o.QKVBias, o.OBias = true, false },
}
