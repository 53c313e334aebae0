// Package config reads drmas run configs: YAML through viper, overridden by DRMAS_ environment
// variables and --set key=value flags, decoded strictly (an unknown key, a wrong type or an
// out-of-range value is an error naming the key and file). configs/reference.yaml documents every key.
// Load reads and checks a config into a Config; ReadResolved reads a run folder's config.yaml back;
// Defaults and DefaultModel are the values a config starts from.
package config
