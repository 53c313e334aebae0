// Package plan is the memory plan of a training run (docs/memory-plan.md): Build works out what each
// device will hold, Check says whether it fits, Write prints it; Probe reads a device's capacity and
// ParseMemory the --device-memory flag.
//
// It counts weights, float32 master weights, gradients, AdamW state, a KL reference, the activations
// of one micro-batch, the logits chunk and the rollout KV cache, worked out from the run config and
// each model's config.json alone, before anything is loaded. `drmas train --dry-run` prints it;
// `drmas train` refuses a run whose plan exceeds a device (cmd/drmas/train.go).
package plan
