package train

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/shard"
	"github.com/drmas/drmas/pkg/torch"
)

// TestOptimIndexNamesWhatIsMissing: a sharded optimizer state whose index names a partition that is
// not there, or that is not JSON, is an error naming the file; a folder without an index is unsharded.
func TestOptimIndexNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := rundir.ReadOptimIndex(dir); ok || err != nil {
		t.Fatalf("no index: ok %v, err %v; want an unsharded folder", ok, err)
	}
	index := filepath.Join(dir, rundir.OptimIndexFile)
	write := func(s string) {
		if err := os.WriteFile(index, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"world_size": 2, "shard": "gradients", "weight_map": {"exp_avg.w": "optim.rank-1-of-2.safetensors"}}`)
	if _, _, err := rundir.ReadOptimIndex(dir); err == nil || !strings.Contains(err.Error(), "optim.rank-1-of-2.safetensors") {
		t.Errorf("missing partition: %v, want an error naming it", err)
	}
	write(`{"world_size": 2, "weight_map": {"exp_avg.w": "../elsewhere.safetensors"}}`)
	if _, _, err := rundir.ReadOptimIndex(dir); err == nil || !strings.Contains(err.Error(), "elsewhere") {
		t.Errorf("a partition outside the folder: %v, want an error naming it", err)
	}
	write(`{"world_size": 2, "weight_map": {`)
	if _, _, err := rundir.ReadOptimIndex(dir); err == nil || !strings.Contains(err.Error(), index) {
		t.Errorf("truncated index: %v, want an error naming %s", err, index)
	}
	if err := os.WriteFile(filepath.Join(dir, "optim.rank-0-of-1.safetensors"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	write(`{"world_size": 1, "shard": "optimizer", "weight_map": {"exp_avg.w": "optim.rank-0-of-1.safetensors"}}`)
	if idx, ok, err := rundir.ReadOptimIndex(dir); !ok || err != nil || idx.WorldSize != 1 || idx.Shard != "optimizer" {
		t.Errorf("good index: %+v ok %v err %v", idx, ok, err)
	}
}

// TestReleasedGradientsComeBack: under dist.shard gradients a rank frees the gradients it does not
// own between backward passes; they come back zeroed, of their parameters' shapes, and the next
// backward accumulates into them as into never-released ones; the owned gradients are untouched and
// their sum of squares is what the partitioned norm adds up.
func TestReleasedGradientsComeBack(t *testing.T) {
	torch.Do(func() error {
		params := []*ts.Tensor{
			ts.MustOfSlice([]float32{1, 2, 3, 4}).MustSetRequiresGrad(true, true),
			ts.MustOfSlice([]float32{5, 6}).MustSetRequiresGrad(true, true),
			ts.MustOfSlice([]float32{7, 8, 9}).MustSetRequiresGrad(true, true),
		}
		backward := func() { // d/dp of Σ p² = 2p
			s := torch.NewScope()
			defer s.Close()
			var loss *ts.Tensor
			for _, p := range params {
				sq := p.MustSquare(false).MustSum(gotch.Float, true)
				if loss == nil {
					loss = sq
				} else {
					loss = loss.MustAdd(sq, true)
				}
			}
			loss.MustBackward()
		}
		backward()
		part := shard.PartitionOf(params, 2, 1) // rank 1 of 2: the 4-element parameter goes to rank 0
		if part.Owns(0) || !part.Owns(1) || !part.Owns(2) {
			t.Fatalf("owners %v, want [0 1 1]", part.Owner)
		}
		releaseGrads(params, part)
		if n := heldGradElements(params); n != 5 {
			t.Fatalf("after release: %d gradient elements held, want 5 (the owned 2 + 3)", n)
		}
		_, owned := part.Mine([]string{"a", "b", "c"}, params)
		if sq := gradSquares(owned); !near(sq, 4*(25+36+49+64+81)) {
			t.Errorf("owned sum of squares %g, want %g", sq, 4.0*(25+36+49+64+81))
		}
		ZeroGrad(params) // the step zeroes released gradients too (no-op on them)
		restoreGrads(params, part)
		if n := heldGradElements(params); n != 9 {
			t.Fatalf("after restore: %d gradient elements held, want 9", n)
		}
		if sq := gradSquares(params); sq != 0 {
			t.Errorf("restored gradients not zero: sum of squares %g", sq)
		}
		backward()
		s := torch.NewScope()
		defer s.Close()
		if got := params[0].MustGrad(false).Float64Values(); !slices.Equal(got, []float64{2, 4, 6, 8}) {
			t.Errorf("gradient after a backward into a restored one: %v, want [2 4 6 8]", got)
		}
		return nil
	})
}
