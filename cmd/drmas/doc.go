// Command drmas post-trains multi-agent LLM systems with GRPO and Dr. MAS agent-wise normalization.
//
// newRootCmd (root.go) builds the command tree from one explicit list of constructors, one file per
// command (newTrainCmd, newEvalCmd, newInspectGradsCmd, newServeCmd, …), each with its flags and
// examples. main maps errors to exit codes: 2 for bad input (usageError, badInput), 1 for failures
// after the start.
package main
