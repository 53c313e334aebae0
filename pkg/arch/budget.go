package arch

// The default working-set bounds of the forward and backward passes (pkg/policy holds them in
// variables that its tests lower; pkg/plan reads them here).
//
// TileBudget bounds the elements of one attention tile's score matrix [B, H, n, S]: 16 MiB in
// float32 on the CPU, below glibc's mmap threshold (pkg/torch), so that a tile's tensors come from
// the heap instead of fresh pages faulted in anew each time; TileBudgetCUDA, 256 MiB on CUDA. A tile
// has at least TileFloor query rows (or all of them), whatever the budget says, so that its products
// stay efficient.
//
// LogitsBudget bounds one chunk of logits, in elements (64 Mi: 256 MiB in float32; a 152k
// vocabulary gives 441 tokens a chunk). A chunk has at least LogitsFloor tokens.
const (
	TileBudget     int64 = 1 << 22
	TileBudgetCUDA int64 = 1 << 26
	TileFloor      int64 = 16
	LogitsBudget   int64 = 1 << 26
	LogitsFloor    int64 = 16
)

// TileRows is the number of query rows of one attention tile for B sequences of H query heads, T
// queries against S keys, under a budget of elements per tile and at least floor rows.
func TileRows(budget, floor, B, H, T, S int64) int64 {
	n := budget / max(1, B*H*S)
	return min(T, max(n, floor, 1))
}

// AttentionTileRows is TileRows under the default budgets, on CUDA or not (for memory plans: the
// tile's scores are [B, H, rows, S] float32).
func AttentionTileRows(B, H, T, S int64, cuda bool) int64 {
	budget := TileBudget
	if cuda {
		budget = TileBudgetCUDA
	}
	return TileRows(budget, TileFloor, B, H, T, S)
}

// LogitsChunk is the number of tokens per chunk of lm_head for a vocabulary of V and N tokens in
// all, under a budget of elements per chunk.
func LogitsChunk(budget, V, N int64) int64 {
	return min(N, max(budget/max(V, 1), LogitsFloor))
}

// LogitsChunkTokens is LogitsChunk under the default budget: the number of response tokens whose
// logits exist at once (for memory plans: the chunk's logits are [rows, V]).
func LogitsChunkTokens(V, N int64) int64 { return LogitsChunk(LogitsBudget, V, N) }
