// Package inspect reads training runs' metrics.jsonl files and reports on their per-agent and per-model
// pre-clip gradient norms: ReadMetrics and Summarize give robust statistics, spikes against a trailing
// median, non-finite norms and skipped optimizer steps, side by side across runs (GRPO vs Dr. MAS),
// with Plot; Judge and CounterfactualReport give the per-agent verdict on the ΣA² energy ratio, and
// Pool pools counterfactual reports.
//
// Why it matters (docs/algorithm.md, Lemma 4.2 of the paper): under a global GRPO baseline agent k's expected
// squared gradient norm is scaled by (σ_k² + (μ_k − μ)²)/σ², the inflation factor the trainer logs as
// inflation/agent/<a>; an agent whose reward statistics differ from the team's spikes. Dr. MAS makes the
// factor 1. This package measures whether that happened in a run.
package inspect
