// Package arch holds the architecture facts of the decoder language models drmas runs, in pure Go:
// a Hugging Face config.json read, defaulted and checked (Config, ReadConfig, ParseConfig), the
// registered model families (Family, Names: one file each plus one line in families), the options
// a family derives from its config (OptionsOf), the weights' names and shapes and the parameter
// counts of models and LoRA adapters (Shapes, ParamCount, LoRAShapes), dtype names, and the
// working-set bounds of the forward pass (AttentionTileRows, LogitsChunkTokens).
//
// It builds without libtorch, so that pkg/config checks a run's models and pkg/plan computes a
// memory plan from the config and config.json alone; pkg/policy runs the models on libtorch from
// the same facts.
package arch
