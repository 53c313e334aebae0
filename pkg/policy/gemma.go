package policy

import (
	"fmt"
	"github.com/drmas/drmas/pkg/policy/modeltype"
	"math"

	"github.com/sugarme/gotch/ts"
)

// Gemma is the model_type of Google's Gemma (first generation).
var Gemma = modeltype.Gemma

// gemma is Google's Gemma: the Llama block with norms that
// multiply by (1 + w) (gemmaNorm), a gated MLP with GELU (tanh approximation: hidden_activation, which
// transformers reads instead of hidden_act), token embeddings scaled by √hidden_size, a head_dim
// of its own (256 unless config.json says otherwise, not hidden_size / heads), biases on q/k/v/o
// when attention_bias is set, and tied embeddings unless config.json unties them.
var gemma = family{
	modelType:    Gemma,
	architecture: "GemmaForCausalLM",
	defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 8192
		}
		if c.HeadDim == 0 {
			c.HeadDim = 256
		}
		if c.HiddenAct == "" {
			c.HiddenAct = "gelu_pytorch_tanh"
		}
		if c.raw != nil && !c.has("tie_word_embeddings") {
			c.TieWordEmbeddings = true
		}
	},
	check: func(c Config) error {
		_, err := gemmaActivation(c)
		return err
	},
	options: func(c Config, o *options) {
		o.act, _ = gemmaActivation(c)
		o.embedScale = math.Sqrt(float64(c.HiddenSize))
	},
	layer: func(o *options) layer {
		return &decoderLayer{
			InputLayernorm:         &gemmaNorm{dim: o.hidden},
			SelfAttn:               newAttention(o),
			PostAttentionLayernorm: &gemmaNorm{dim: o.hidden},
			MLP:                    newMLP(o),
		}
	},
	norm: func(o *options) norm { return &gemmaNorm{dim: o.hidden} },
}

// gemmaActivation is the MLP's activation: hidden_activation, gelu_pytorch_tanh when it is absent
// or null (transformers' rule; hidden_act is not read).
func gemmaActivation(c Config) (func(*ts.Tensor) *ts.Tensor, error) {
	act := "gelu_pytorch_tanh"
	if _, err := c.Raw("hidden_activation", &act); err != nil {
		return nil, err
	}
	switch act {
	case "gelu_pytorch_tanh":
		return func(x *ts.Tensor) *ts.Tensor { return x.MustGelu("tanh", true) }, nil
	case "gelu":
		return func(x *ts.Tensor) *ts.Tensor { return x.MustGelu("none", true) }, nil
	}
	return nil, fmt.Errorf("hidden_activation %q: want gelu_pytorch_tanh or gelu", act)
}

// gemmaNorm is Gemma's RMSNorm: x / sqrt(mean(x²) + ε) · (1 + w), all in float32 (float64 for a
// float64 model) and cast back at the end. Its weight starts at zero.
type gemmaNorm struct {
	Weight *ts.Tensor // weight [dim]
	dim    int64
}

// scalarOne is the 1 of (1 + w).
var scalarOne = ts.FloatScalar(1)

func (n *gemmaNorm) weights(prefix string, out *[]slot) {
	*out = append(*out, slot{prefix + "weight", []int64{n.dim}, initZeros, &n.Weight})
}

func (n *gemmaNorm) forward(x *ts.Tensor, p *pass) *ts.Tensor {
	w := cast(n.Weight, p.m.compute).MustAddScalar(scalarOne, false)
	return cast(rms(x, p.m).MustMul(w, true), x.DType())
}
