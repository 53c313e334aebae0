package shard

import (
	"github.com/drmas/drmas/pkg/plan"
	"github.com/sugarme/gotch/ts"
)

// Partition says which rank owns each of a model's parameters: whole parameters, balanced by
// element count (plan.Balance), so every rank computes the same partition. It is the ZeRO stages'
// (dist.shard optimizer, gradients: each rank steps the parameters it owns) and every sharded
// checkpoint's (which rank writes which tensor's optimizer state). Read-only once made.
type Partition struct {
	Rank, World int
	Owner       []int   // per parameter
	Load        []int64 // elements per rank
}

// NewPartition partitions parameters of the given element counts among world ranks, for rank
// (plan.Balance: the memory plan counts the same partition).
func NewPartition(sizes []int64, world, rank int) *Partition {
	owner, load := plan.Balance(sizes, world)
	return &Partition{Rank: rank, World: world, Owner: owner, Load: load}
}

// PartitionOf is the partition of a model's parameters.
func PartitionOf(params []*ts.Tensor, world, rank int) *Partition {
	sizes := make([]int64, len(params))
	for i, t := range params {
		sizes[i] = int64(t.Numel())
	}
	return NewPartition(sizes, world, rank)
}

// Owns reports whether this rank owns parameter i (every parameter when p is nil: unsharded).
func (p *Partition) Owns(i int) bool { return p == nil || p.Owner[i] == p.Rank }

// Mine returns the names and tensors of the parameters this rank owns.
func (p *Partition) Mine(names []string, params []*ts.Tensor) ([]string, []*ts.Tensor) {
	if p == nil {
		return names, params
	}
	var n []string
	var t []*ts.Tensor
	for i := range params {
		if p.Owns(i) {
			n = append(n, names[i])
			t = append(t, params[i])
		}
	}
	return n, t
}

// Imbalance is the largest rank's element count over the mean (1 = perfectly balanced).
func (p *Partition) Imbalance() float64 {
	var total, most int64
	for _, l := range p.Load {
		total += l
		most = max(most, l)
	}
	if total == 0 {
		return 1
	}
	return float64(most) * float64(p.World) / float64(total)
}
