// Package env holds the multi-agent side of drmas: agents, orchestras, tools, datasets and rewards.
// NewOrchestra builds an Orchestra (math, search, dial or a config-defined flow) that rolls a batch of
// tasks out into a Rollout of trajectories and agent calls; Evaluate gives avg@k and pass@k;
// WriteTranscripts writes the rollout dumps.
//
// It talks to language models only through the llm.Generator seam, which pkg/policy implements
// and tests fake with scripted policies. It never imports libtorch.
package env
