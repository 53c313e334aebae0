package train

import (
	"github.com/drmas/drmas/pkg/plan"
	"github.com/sugarme/gotch/ts"
)

// partition says which rank owns each of a model's parameters: whole parameters, balanced by
// element count (plan.Balance), so every rank computes the same partition.
type partition struct {
	rank, world int
	owner       []int   // per parameter
	load        []int64 // elements per rank
}

// newPartition partitions parameters of the given element counts among world ranks, for rank
// (plan.Balance: the memory plan counts the same partition).
func newPartition(sizes []int64, world, rank int) *partition {
	owner, load := plan.Balance(sizes, world)
	return &partition{rank: rank, world: world, owner: owner, load: load}
}

// partitionOf is the partition of a model's parameters.
func partitionOf(params []*ts.Tensor, world, rank int) *partition {
	sizes := make([]int64, len(params))
	for i, t := range params {
		sizes[i] = int64(t.Numel())
	}
	return newPartition(sizes, world, rank)
}

// owns reports whether this rank owns parameter i (every parameter when p is nil: unsharded).
func (p *partition) owns(i int) bool { return p == nil || p.owner[i] == p.rank }

// mine returns the names and tensors of the parameters this rank owns.
func (p *partition) mine(names []string, params []*ts.Tensor) ([]string, []*ts.Tensor) {
	if p == nil {
		return names, params
	}
	var n []string
	var t []*ts.Tensor
	for i := range params {
		if p.owns(i) {
			n = append(n, names[i])
			t = append(t, params[i])
		}
	}
	return n, t
}

// imbalance is the largest rank's element count over the mean (1 = perfectly balanced).
func (p *partition) imbalance() float64 {
	var total, most int64
	for _, l := range p.load {
		total += l
		most = max(most, l)
	}
	if total == 0 {
		return 1
	}
	return float64(most) * float64(p.world) / float64(total)
}
