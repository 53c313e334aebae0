package shard

import (
	"slices"
	"testing"

	"github.com/sugarme/gotch/ts"
)

// TestPartitionBalancedAndDisjoint: every parameter has exactly one owner, every rank computes the
// same owners, the largest rank holds at most the mean plus the largest parameter, and Mine lists
// exactly the owned parameters in order.
func TestPartitionBalancedAndDisjoint(t *testing.T) {
	sizes := []int64{4096, 64, 64, 1024, 1024, 4096, 32, 2048, 7, 1}
	var total, largest int64
	for _, s := range sizes {
		total += s
		largest = max(largest, s)
	}
	for _, world := range []int{1, 2, 3, 4, 8} {
		parts := make([]*Partition, world)
		for r := range parts {
			parts[r] = NewPartition(sizes, world, r)
		}
		for r := 1; r < world; r++ {
			if !slices.Equal(parts[r].Owner, parts[0].Owner) {
				t.Fatalf("world %d: rank %d's owners %v differ from rank 0's %v", world, r, parts[r].Owner, parts[0].Owner)
			}
		}
		count := make([]int64, world)
		for i, o := range parts[0].Owner {
			if o < 0 || o >= world {
				t.Fatalf("world %d: parameter %d owned by %d", world, i, o)
			}
			owners := 0
			for r := range parts {
				if parts[r].Owns(i) {
					owners++
				}
			}
			if owners != 1 {
				t.Fatalf("world %d: parameter %d has %d owners", world, i, owners)
			}
			count[o] += sizes[i]
		}
		for r, c := range count {
			if c != parts[0].Load[r] {
				t.Fatalf("world %d: rank %d load %d, counted %d", world, r, parts[0].Load[r], c)
			}
			if c > total/int64(world)+largest {
				t.Errorf("world %d: rank %d holds %d of %d elements (mean %d, largest parameter %d)", world, r, c, total, total/int64(world), largest)
			}
		}
		names := make([]string, len(sizes))
		for i := range names {
			names[i] = string(rune('a' + i))
		}
		for r, p := range parts {
			got, _ := p.Mine(names, make([]*ts.Tensor, len(sizes)))
			var want []string
			for i, o := range p.Owner {
				if o == r {
					want = append(want, names[i])
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("world %d rank %d: mine %v, want %v", world, r, got, want)
			}
		}
		t.Logf("world %d: loads %v, imbalance %.3f", world, parts[0].Load, parts[0].Imbalance())
	}
	// Two equal halves split evenly.
	p := NewPartition([]int64{10, 10, 10, 10}, 2, 0)
	if p.Load[0] != 20 || p.Load[1] != 20 || p.Imbalance() != 1 {
		t.Errorf("4 × 10 on 2 ranks: loads %v", p.Load)
	}
	var none *Partition
	if !none.Owns(3) {
		t.Error("an unsharded model (nil partition) must own every parameter")
	}
}
