package bench

import (
	"path/filepath"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
)

// The real-size round trip at a small shape: Qwen3-0.6B's config.json (configs/models) with its sizes
// cut down, saved in shards, loaded back bit-exact, generating, and a training step that moves the
// weights. The real sizes run with `drmas roundtrip` (README).
func TestRoundTripSmall(t *testing.T) {
	cfg, err := arch.ReadConfig(filepath.Join("..", "..", "configs", "models", "qwen3-0.6b.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.HiddenSize, cfg.IntermediateSize, cfg.NumHiddenLayers, cfg.VocabSize, cfg.HeadDim = 64, 128, 2, 300, 16
	r, err := RoundTrip(cfg, RoundTripOptions{Dir: t.TempDir(), DType: gotch.Float, MaxShardBytes: 40_000, Seed: 1,
		Batch: 2, PromptLen: 5, ResponseLen: 4, Train: true})
	if err != nil {
		t.Fatal(err)
	}
	if !r.BitExact || r.Shards < 3 || !r.TrainChanged || r.GenTokensPerSec <= 0 || r.TrainMsPerStep <= 0 {
		t.Fatalf("round trip: %+v", r)
	}
	if r.Params != cfg.NumParams() {
		t.Errorf("params %d, want %d", r.Params, cfg.NumParams())
	}
}
