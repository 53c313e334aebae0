package microbatch

import "sort"

// MinFill is how long, at least, a packed micro-batch's sequences are as a fraction of its longest:
// padding is under 1 − MinFill of a packed micro-batch's positions.
const MinFill = 0.9

// Split cuts the sequences of the given lengths (prompt + response tokens) into micro-batches and
// returns each as indices into lengths. maxTokens > 0 packs by that budget (count is then ignored):
// the indices sorted by length, descending, ties in their order, and cut next-fit: a micro-batch
// takes the next sequence while (rows + 1) × its first (longest) length ≤ maxTokens and the sequence
// is at least MinFill of that length; a sequence longer than the budget is a micro-batch of its own. Otherwise consecutive runs of count indices
// in order (count ≤ 0: one micro-batch of all).
func Split(lengths []int, count, maxTokens int) [][]int {
	n := len(lengths)
	if n == 0 {
		return nil
	}
	if maxTokens <= 0 {
		if count <= 0 {
			count = n
		}
		var out [][]int
		for lo := 0; lo < n; lo += count {
			mb := make([]int, 0, min(count, n-lo))
			for i := lo; i < min(lo+count, n); i++ {
				mb = append(mb, i)
			}
			out = append(out, mb)
		}
		return out
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return lengths[order[a]] > lengths[order[b]] })
	var out [][]int
	var cur []int
	for _, i := range order {
		if len(cur) > 0 {
			first := lengths[cur[0]]
			if (len(cur)+1)*first > maxTokens || float64(lengths[i]) < MinFill*float64(first) {
				out = append(out, cur)
				cur = nil
			}
		}
		cur = append(cur, i)
	}
	return append(out, cur)
}

// Cost is the padded positions of micro-batches (Σ rows × longest row) and the real ones (Σ lengths).
func Cost(lengths []int, mbs [][]int) (padded, real int) {
	for _, mb := range mbs {
		longest := 0
		for _, i := range mb {
			longest = max(longest, lengths[i])
			real += lengths[i]
		}
		padded += len(mb) * longest
	}
	return padded, real
}

// Padding is the fraction of the micro-batches' padded positions that are padding.
func Padding(lengths []int, mbs [][]int) float64 {
	padded, real := Cost(lengths, mbs)
	if padded == 0 {
		return 0
	}
	return 1 - float64(real)/float64(padded)
}

// Pack cuts the sequences of the given lengths into micro-batches of packed rows: each micro-batch
// is one row that holds its sequences one after the other (policy.Model.TrainScorePacked), at most
// maxTokens real tokens in all, so no position is padding. First-fit decreasing: the indices sorted
// by length, descending, ties in their order, each into the first micro-batch it fits; a sequence
// longer than maxTokens is a micro-batch of its own. Within a micro-batch the indices are in the
// order they were placed. maxTokens ≤ 0: one micro-batch of all.
func Pack(lengths []int, maxTokens int) [][]int {
	n := len(lengths)
	if n == 0 {
		return nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return lengths[order[a]] > lengths[order[b]] })
	if maxTokens <= 0 {
		return [][]int{order}
	}
	var out [][]int
	var used []int
	for _, i := range order {
		placed := false
		for k := range out {
			if used[k]+lengths[i] <= maxTokens {
				out[k], used[k] = append(out[k], i), used[k]+lengths[i]
				placed = true
				break
			}
		}
		if !placed {
			out, used = append(out, []int{i}), append(used, lengths[i])
		}
	}
	return out
}
