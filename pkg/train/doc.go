// Package train is the training loop of a multi-agent team: New prepares a run (run folder, team,
// optimizers, data-parallel group) and Trainer.Run iterates rollout → advantages → update, with
// checkpoints (CheckpointDir, VerifyManifest) and --resume. LoadTeam builds the orchestra, policies and
// data that train, eval (Team.Evaluate) and inspect-grads (Counterfactual) share; Check is the dry run.
package train
