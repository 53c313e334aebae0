// Package modeltype registers the model families pkg/policy runs (Names: config.json's model_type,
// and models[].init.model_type), their size bounds (MaxSizes) and the LoRA target module names
// (LoRATargets, LoRAModules).
//
// It is libtorch-free so that pkg/config checks these keys without building pkg/policy; pkg/policy
// checks at init that its families are exactly these names. A new family is its file in pkg/policy,
// its line in policy's families list, and one line here.
package modeltype
