// Package train is the training loop of a multi-agent team. New assembles a Trainer from its
// components, each built once from its own config section: the model groups with their optimizers,
// the parallel strategy (collectives only: single, dataParallel, sharded, and fsdp over the sharded
// weights of pkg/shard under dist.shard parameters), the checkpointer over the run folder
// (pkg/rundir), the engines' fleet (pkg/engine), the rollout source (pkg/rollout) and the reporter
// (pkg/report). Trainer.Run iterates the step of step.go: publish → next rollout → advantages → per
// model group ppo_epochs × ppo_mini_update_num optimizer steps, each a per-agent backward
// (modelState.backward) → the source told of the update → report. LoadTeam opens the team's world
// (pkg/team) and loads its policies, which train, eval (Team.Evaluate) and inspect-grads
// (Counterfactual) share.
package train
