package plan

import "sort"

// Balance partitions parameters of the given element counts among world ranks, as sharded training
// (dist.shard, pkg/train/shard.go) holds them: whole parameters, largest first, each to the rank with
// the fewest elements so far (ties: the earlier parameter, the lower rank). It returns each
// parameter's rank and each rank's element count; every rank computes the same.
func Balance(sizes []int64, world int) (owner []int, load []int64) {
	owner, load = make([]int, len(sizes)), make([]int64, max(world, 1))
	order := make([]int, len(sizes))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return sizes[order[a]] > sizes[order[b]] })
	for _, i := range order {
		r := 0
		for k := 1; k < len(load); k++ {
			if load[k] < load[r] {
				r = k
			}
		}
		owner[i] = r
		load[r] += sizes[i]
	}
	return owner, load
}
