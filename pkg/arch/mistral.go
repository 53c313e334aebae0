package arch

import (
	"errors"
	"fmt"
)

// Mistral is the model_type of Mistral 7B and the models that share its layout.
const Mistral = "mistral"

// mistral is the Llama block without biases, with sliding-window attention: each query attends to
// the sliding_window most recent keys, itself included (4096 when config.json omits the key, none
// when it is null). Windows shorter than the sequence are applied in full, in the masks of every
// forward pass (training, scoring, prefill and cached decoding alike); the KV cache still holds the
// whole sequence.
var mistral = Family{
	ModelType:    Mistral,
	Architecture: "MistralForCausalLM",
	Defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 4096 * 32
		}
		if !c.has("sliding_window") {
			c.SetRaw("sliding_window", 4096)
		}
	},
	Check: func(c Config) error {
		_, err := mistralWindow(c)
		return errors.Join(checkSiLU(c), err)
	},
	Options: func(c Config, o *Options) {
		o.QKVBias, o.OBias = false, false
		o.Window, _ = mistralWindow(c)
	},
}

// mistralWindow reads sliding_window: a number of tokens > 0, or null (0: no window).
func mistralWindow(c Config) (int64, error) {
	var w float64
	ok, err := c.Raw("sliding_window", &w)
	if err != nil {
		return 0, fmt.Errorf("%w: want a number of tokens or null", err)
	}
	if ok && (w < 1 || w != float64(int64(w))) {
		return 0, fmt.Errorf("sliding_window: want a whole number of tokens ≥ 1 or null, got %v", w)
	}
	return int64(w), nil
}
