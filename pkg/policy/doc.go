// Package policy runs decoder language models of the families pkg/arch registers (Llama, Qwen2,
// Qwen3 …) on libtorch (through gotch) as drmas policies: Hugging Face checkpoints in and out,
// batched KV-cache generation behind the llm.Generator seam, exact per-token log-probs for training
// and LoRA adapters. What a model is (config.json, the families' options, the weights' shapes) is
// pkg/arch's; this package holds its tensors and runs them.
//
// Threading: every function that touches tensors must run on the torch thread (torch.Do). Generate
// (Policy and Router) enters it by itself, because orchestras call it from ordinary goroutines; all
// the others (NewRandom, Load, Save, Forward, Score, …) expect to be called from inside torch.Do
// and must not call it themselves, since Do does not nest.
package policy
