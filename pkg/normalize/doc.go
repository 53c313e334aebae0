// Package normalize computes GRPO and Dr. MAS advantages for multi-agent rollouts (arXiv 2602.08847):
// Compute turns a batch of Samples into advantages with the estimator its Options choose (GRPO, DrMAS,
// ATGRPO, RoleBaseline, Preset by name), Compare and EnergyRatios set estimators side by side by ΣA²,
// and ReadRecords / WriteRecords read and write the rollout records `drmas advantages` takes.
//
// A Sample is one agent call; Compute groups the samples of a batch by prompt (uid), trajectory and
// agent, applies the estimator chosen by Options and returns one advantage per sample together with
// per-agent and per-group statistics, the Lemma 4.2 inflation factors among them. The estimators
// themselves are the small pure functions of estimators.go, whose header has the formulas of every
// mean × std combination. The package is pure Go: no libtorch.
package normalize
