package arch

import (
	"fmt"
	"math"
)

// Gemma is the model_type of Google's Gemma (first generation).
const Gemma = "gemma"

// gemma is Google's Gemma: the Llama block with norms that multiply by (1 + w) (OffsetNorm), a
// gated MLP with GELU (tanh approximation: hidden_activation, which transformers reads instead of
// hidden_act), token embeddings scaled by √hidden_size, a head_dim of its own (256 unless
// config.json says otherwise, not hidden_size / heads), biases on q/k/v/o when attention_bias is
// set, and tied embeddings unless config.json unties them.
var gemma = Family{
	ModelType:    Gemma,
	Architecture: "GemmaForCausalLM",
	Defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 8192
		}
		if c.HeadDim == 0 {
			c.HeadDim = 256
		}
		if c.HiddenAct == "" {
			c.HiddenAct = ActGELUTanh
		}
		if c.raw != nil && !c.has("tie_word_embeddings") {
			c.TieWordEmbeddings = true
		}
	},
	Check: func(c Config) error {
		_, err := gemmaActivation(c)
		return err
	},
	Options: func(c Config, o *Options) {
		o.Act, _ = gemmaActivation(c)
		o.OffsetNorm = true
		o.EmbedScale = math.Sqrt(float64(c.HiddenSize))
	},
}

// gemmaActivation is the MLP's activation: hidden_activation, gelu_pytorch_tanh when it is absent
// or null (transformers' rule; hidden_act is not read).
func gemmaActivation(c Config) (string, error) {
	act := ActGELUTanh
	if _, err := c.Raw("hidden_activation", &act); err != nil {
		return "", err
	}
	switch act {
	case ActGELUTanh, ActGELU:
		return act, nil
	}
	return "", fmt.Errorf("hidden_activation %q: want gelu_pytorch_tanh or gelu", act)
}
