// Package metric is the table of metrics.jsonl keys (docs/contracts.md): a constant for each fixed
// key and a builder for each family of keys that carry an agent name, a model id, a dataset or k.
// Training writes its keys through it and drmas inspect reads them through it, so the writer, the
// reader and the documentation (which a test holds to Families) name the same keys.
//
// Given "" a builder returns its family's prefix, for a reader that parses keys
// (GradNormAgent("") is "grad_norm/agent/"). The package is pure Go, without libtorch.
package metric
