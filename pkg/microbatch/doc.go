// Package microbatch cuts a batch of sequences into the micro-batches of one forward/backward each:
// by count (consecutive runs of a fixed number of sequences, in their order) or by a token budget
// (algorithm.max_tokens_per_micro_batch: the sequences sorted by length, longest first, packed so that
// a micro-batch's padded cost, rows × its longest row, stays within the budget, and its rows are of
// like length). Every micro-batch is padded to its longest sequence, so packing sequences of like
// length wastes little on padding when lengths are long-tailed. Pure Go: the trainer and the bench
// share it.
package microbatch
