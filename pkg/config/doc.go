// Package config reads drmas run configs: YAML through viper, overridden by DRMAS_ environment
// variables and --set key=value flags, decoded strictly (an unknown key, a wrong type or an
// out-of-range value is an error naming the key and file). configs/reference.yaml documents every key.
// A Config assembles the sections their components own — pkg/model (models[]), pkg/team (agents,
// orchestra, data, toy, retriever, reward, tools), pkg/algo (algorithm), pkg/rollout, pkg/dist and
// pkg/report (run's reporting keys) — each validated by its owner; this package checks how they fit
// each other. Load reads and checks a config; ReadResolved reads a run folder's config.yaml back;
// Defaults is what a config starts from.
package config
