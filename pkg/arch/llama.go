package arch

// Llama is the model_type of Meta's Llama (1 to 3.x) and of the many models that reuse its layout.
const Llama = "llama"

// llama is the plain pre-norm decoder: RMSNorm, grouped-query attention with rotary embeddings
// (llama3 rope scaling included), SiLU-gated MLP; attention_bias puts biases on q/k/v/o and
// mlp_bias on the MLP.
var llama = Family{
	ModelType:    Llama,
	Architecture: "LlamaForCausalLM",
	Defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 2048
		}
	},
	Check:   checkSiLU,
	Options: func(c Config, o *Options) { o.MLPBias = c.MLPBias },
}
