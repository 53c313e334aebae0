// Package train is the training loop of a multi-agent team. New assembles a Trainer from its
// components — the model groups with their optimizers, the parallel strategy (collectives only:
// single, dataParallel, sharded), the checkpointer over the run folder (pkg/rundir) and the engine
// sync — and Trainer.Run iterates the step of step.go: rollout → advantages → per model group
// ppo_epochs × ppo_mini_update_num optimizer steps, each a per-agent backward (modelState.backward).
// LoadTeam builds the orchestra, policies and data that train, eval (Team.Evaluate) and inspect-grads
// (Counterfactual) share; Check is the dry run.
package train
