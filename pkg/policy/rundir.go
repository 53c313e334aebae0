package policy

import "github.com/drmas/drmas/pkg/rundir"

// A run folder's checkpoints hold safetensors files; their headers are checked before a resume.
var _ = rundir.CheckFiles(".safetensors", CheckSafetensors)
