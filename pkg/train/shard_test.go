package train

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sugarme/gotch/ts"
)

// TestPartitionBalancedAndDisjoint: every parameter has exactly one owner, every rank computes the
// same owners, the largest rank holds at most the mean plus the largest parameter, and mine lists
// exactly the owned parameters in order.
func TestPartitionBalancedAndDisjoint(t *testing.T) {
	sizes := []int64{4096, 64, 64, 1024, 1024, 4096, 32, 2048, 7, 1}
	var total, largest int64
	for _, s := range sizes {
		total += s
		largest = max(largest, s)
	}
	for _, world := range []int{1, 2, 3, 4, 8} {
		parts := make([]*partition, world)
		for r := range parts {
			parts[r] = newPartition(sizes, world, r)
		}
		for r := 1; r < world; r++ {
			if !slices.Equal(parts[r].owner, parts[0].owner) {
				t.Fatalf("world %d: rank %d's owners %v differ from rank 0's %v", world, r, parts[r].owner, parts[0].owner)
			}
		}
		count := make([]int64, world)
		for i, o := range parts[0].owner {
			if o < 0 || o >= world {
				t.Fatalf("world %d: parameter %d owned by %d", world, i, o)
			}
			owners := 0
			for r := range parts {
				if parts[r].owns(i) {
					owners++
				}
			}
			if owners != 1 {
				t.Fatalf("world %d: parameter %d has %d owners", world, i, owners)
			}
			count[o] += sizes[i]
		}
		for r, c := range count {
			if c != parts[0].load[r] {
				t.Fatalf("world %d: rank %d load %d, counted %d", world, r, parts[0].load[r], c)
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
			got, _ := p.mine(names, make([]*ts.Tensor, len(sizes)))
			var want []string
			for i, o := range p.owner {
				if o == r {
					want = append(want, names[i])
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("world %d rank %d: mine %v, want %v", world, r, got, want)
			}
		}
		t.Logf("world %d: loads %v, imbalance %.3f", world, parts[0].load, parts[0].imbalance())
	}
	// Two equal halves split evenly.
	p := newPartition([]int64{10, 10, 10, 10}, 2, 0)
	if p.load[0] != 20 || p.load[1] != 20 || p.imbalance() != 1 {
		t.Errorf("4 × 10 on 2 ranks: loads %v", p.load)
	}
	var none *partition
	if !none.owns(3) {
		t.Error("an unsharded model (nil partition) must own every parameter")
	}
}

// TestOptimIndexNamesWhatIsMissing: a sharded optimizer state whose index names a partition that is
// not there, or that is not JSON, is an error naming the file; a folder without an index is unsharded.
func TestOptimIndexNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := readOptimIndex(dir); ok || err != nil {
		t.Fatalf("no index: ok %v, err %v; want an unsharded folder", ok, err)
	}
	index := filepath.Join(dir, optimIndexFile)
	write := func(s string) {
		if err := os.WriteFile(index, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"world_size": 2, "shard": "gradients", "weight_map": {"exp_avg.w": "optim.rank-1-of-2.safetensors"}}`)
	if _, _, err := readOptimIndex(dir); err == nil || !strings.Contains(err.Error(), "optim.rank-1-of-2.safetensors") {
		t.Errorf("missing partition: %v, want an error naming it", err)
	}
	write(`{"world_size": 2, "weight_map": {"exp_avg.w": "../elsewhere.safetensors"}}`)
	if _, _, err := readOptimIndex(dir); err == nil || !strings.Contains(err.Error(), "elsewhere") {
		t.Errorf("a partition outside the folder: %v, want an error naming it", err)
	}
	write(`{"world_size": 2, "weight_map": {`)
	if _, _, err := readOptimIndex(dir); err == nil || !strings.Contains(err.Error(), index) {
		t.Errorf("truncated index: %v, want an error naming %s", err, index)
	}
	if err := os.WriteFile(filepath.Join(dir, "optim.rank-0-of-1.safetensors"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	write(`{"world_size": 1, "shard": "optimizer", "weight_map": {"exp_avg.w": "optim.rank-0-of-1.safetensors"}}`)
	if idx, ok, err := readOptimIndex(dir); !ok || err != nil || idx.WorldSize != 1 || idx.Shard != "optimizer" {
		t.Errorf("good index: %+v ok %v err %v", idx, ok, err)
	}
}
