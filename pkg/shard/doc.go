// Package shard is training state sharded among the ranks of a c10d group: the partition of a
// model's whole parameters (Partition: which rank owns which parameter's optimizer state, under
// dist.shard optimizer and gradients and in every sharded checkpoint), and parameter sharding
// (dist.shard: parameters; docs/scale-out.md "Parameter sharding"), FSDP2's design:
//
//	weights     every model's weights are cut into units — each decoder layer, and the root
//	            (embeddings, final norm, lm_head) — and each unit, flattened and padded to a multiple
//	            of N, into N contiguous shards; rank r holds shard r of every unit of every model (a
//	            trained model, a LoRA adapters' frozen base, a KL reference): unit (unit.go), and
//	            unitModel (units.go), the model's policy.Units
//	passes      a forward gathers the root, then each layer just before its forward and releases it
//	            right after; a training forward keeps the root for its backward, which gathers each
//	            layer again (recomputing it: a forward's graph would hold the gathered weights) and
//	            reduce-scatters its gradients into the shards as it leaves it. Passes are collectives,
//	            kept in lockstep across ranks doing different work by rounds (rounds.go)
//	models      Weights (weights.go) holds every model's units, adopting each model as it loads, and
//	            the format warm-up's whole models (Whole) and the KL references (Reference)
//	state       the optimizer steps a trained model's shards (State); its state is written to a
//	            checkpoint per whole parameter, gathered unit by unit, and restored from any stage and
//	            world size (optimstate.go)
//
// pkg/train's fsdp strategy (fsdp.go) is the step's collectives over a Weights; this package never
// calls into the step.
package shard
