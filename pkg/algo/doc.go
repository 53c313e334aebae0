// Package algo registers the names of the training algorithm's choices that pkg/train implements on
// libtorch: loss aggregation modes (LossAggModes, algorithm.loss_agg_mode), KL estimators (KLTypes,
// algorithm.kl.type), gradient-guard actions (GuardActions, algorithm.guard.action), off-policy
// corrections (RolloutCorrections, algorithm.rollout_correction.mode), and the parallel
// settings — shard stages (ShardStages, dist.shard), per-agent norms across ranks (AgentNorms,
// dist.agent_norms), c10d backends (Backends, dist.backend) — and optimizer offload (OffloadModes,
// models[].optim.offload).
//
// It is libtorch-free so that pkg/config checks these keys without building pkg/train; pkg/train keys
// its implementations by these names and checks at init that it implements exactly them
// (choice.Set.Covers). A new mode is its implementation in pkg/train plus one line here.
package algo
