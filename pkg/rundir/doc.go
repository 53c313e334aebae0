// Package rundir is a run folder's format and its guarantees: Prepare claims and locks a folder
// (never mixing with or deleting files drmas did not write) and finds the checkpoint to resume from;
// a checkpoint is written as step-N.tmp, sealed (files synced, manifest.json with every file's size and
// CRC-32C), published by one rename, and pruned to run.keep_last; Verify decides at --resume whether a
// step-N folder is complete, and a damaged one is kept aside, never overwritten. AppendMetrics and
// TruncateMetrics keep metrics.jsonl in step with the checkpoints.
package rundir
