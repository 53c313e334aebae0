package policy

import "github.com/drmas/drmas/pkg/policy/modeltype"

// Llama is the model_type of Meta's Llama (1 to 3.x) and of the many models that reuse its layout.
var Llama = modeltype.Llama

// llama is the plain pre-norm decoder (decoderLayer): RMSNorm, grouped-query attention with rotary
// embeddings (llama3 rope scaling included), SiLU-gated MLP; attention_bias puts biases on q/k/v/o
// and mlp_bias on the MLP.
var llama = family{
	modelType:    Llama,
	architecture: "LlamaForCausalLM",
	defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 2048
		}
	},
	check:   checkSiLU,
	options: func(c Config, o *options) { o.mlpBias = c.MLPBias },
	layer:   newDecoderLayer,
}
