// Package policy runs decoder language models of the registered families (Llama, Qwen2, Qwen3,
// Mistral, Gemma) on libtorch through gotch: Load (a Hugging Face folder) and NewRandom make a Model,
// LoadPolicy a Policy (model, tokenizer, chat template; Save writes it back) that generates behind
// llm.Generator with a KVCache, scores log-probs for training and backpropagates in pieces
// (Backprop); NewAdapter and LoadAdapter add LoRA adapters.
//
// Threading: every function that touches tensors must run on the torch thread (torch.Do). Generate
// (Policy and Router) enters it by itself, because orchestras call it from ordinary goroutines; all
// the others (NewRandom, Load, Save, Forward, Score, …) expect to be called from inside torch.Do
// and must not call it themselves, since Do does not nest.
package policy
