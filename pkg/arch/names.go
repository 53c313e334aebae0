package arch

// MaxVocabSize bounds a model's vocab_size, and so the token ids drmas handles: 4M, far above any
// published vocabulary (Gemma 3: 262,144). pkg/policy/tokenizer bounds a tokenizer's ids by the same
// number (its own MaxVocabSize, which it keeps so that it builds without this package; pkg/policy's
// tests hold the two equal).
const MaxVocabSize = 1 << 22

// MaxSizes bounds the sizes of a model's config.json, checked before anything is allocated: the
// same ranges models[].init accepts (pkg/config), with room for every published model of the
// families (Llama-3.1-405B: hidden 16384, 126 layers; Gemma 3: vocab 262144, head_dim 256). A
// config.json beyond them is refused naming the key, instead of building for minutes towards
// terabytes.
var MaxSizes = map[string]int{
	"hidden_size": 1 << 16, "intermediate_size": 1 << 18, "num_hidden_layers": 1 << 10,
	"num_attention_heads": 1 << 10, "num_key_value_heads": 1 << 10, "head_dim": 1 << 13,
	"vocab_size": MaxVocabSize, "max_position_embeddings": 1 << 22,
	// Mixture-of-experts keys (Qwen3-235B-A22B: 128 experts of 1536 features)
	"num_experts": 1 << 12, "moe_intermediate_size": 1 << 18,
}

// LoRATargets are the projections a LoRA adapter can target (their Hugging Face module names, in
// the order an adapter stores them); LoRAAllLinear names all of them (PEFT's "all-linear", which
// leaves lm_head out).
var LoRATargets = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

// LoRAAllLinear is the target_modules value that stands for every LoRATargets projection.
const LoRAAllLinear = "all-linear"

// LoRAEmbed and LoRAHead are the two targets outside the decoder layers: the token embeddings
// (PEFT's embedding LoRA) and lm_head. all-linear leaves both out, as PEFT's does; name them to
// adapt them (with tied embeddings, each side gets its own low-rank term).
const (
	LoRAEmbed = "embed_tokens"
	LoRAHead  = "lm_head"
)

// LoRAModules are every module name target_modules may list, in storage order: the projections,
// then embed_tokens and lm_head.
var LoRAModules = append(append([]string(nil), LoRATargets...), LoRAEmbed, LoRAHead)
