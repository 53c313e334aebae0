// Package bench holds the engines of two commands that measure a model rather than train one:
// `drmas bench` (Run: a training step and KV-cache generation timed on a random model of a named
// Preset or a checkpoint, with FLOP rates and a matmul calibration; optionally LoRA adapters
// trained on the model frozen) and `drmas roundtrip` (RoundTrip: a real-size model initialised,
// saved in shards, loaded back bit-exact, generating and taking a training step, with time and
// peak memory per phase). They use pkg/policy's exported API only.
//
// Like pkg/policy's, every function here that touches tensors expects the torch thread except
// where it says it enters torch.Do itself (Run, RoundTrip).
package bench
