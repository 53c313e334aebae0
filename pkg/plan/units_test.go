package plan

import "testing"

// Parameter sharding (dist.shard: parameters): each rank's weights, gradients, master weights,
// moments and KL reference are its shards of the units (Σ ⌈unit/N⌉ elements); the update adds the
// units in flight; activations are the recomputed ones (the checkpointing formula); the load phase
// holds one whole model; dist.rollout_gather: model gathers the whole weights for the rollout.
func TestPlanParameterSharding(t *testing.T) {
	one, err := Build(smallRun(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := one.Models[0]
	units, err := UnitSizes(m.in.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var total, own int64
	for _, u := range units {
		total += u
		own += (u + 3) / 4
	}
	if total != m.Params || len(units) != m.in.cfg.NumHiddenLayers+1 {
		t.Fatalf("units %v: %d elements of %d parameters", units, total, m.Params)
	}
	ckpt, err := Build(smallRun(t, "models.0.gradient_checkpointing=true"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, gather := range []string{"unit", "model"} {
		pl, err := Build(smallRun(t, "dist.shard=parameters", "dist.rollout_gather="+gather), Options{WorldSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		s, e := pl.Models[0], m.Weights/m.Params
		if s.Weights != own*e || s.Gradients != own*e || s.Optimizer != own*8 || s.Master != own*4 || s.Reference != own*e {
			t.Errorf("weights %d, gradients %d, optimizer %d, master %d, reference %d: want the shards' (%d elements)", s.Weights, s.Gradients, s.Optimizer, s.Master, s.Reference, own)
		}
		state := s.Weights + s.Gradients + s.Optimizer + s.Master
		if whole := m.Weights + m.Gradients + m.Optimizer + m.Master; float64(state) > 0.3*float64(whole) {
			t.Errorf("state per rank %d, one process %d: more than 0.3×", state, whole)
		}
		if s.Activations != ckpt.Models[0].Activations || s.Gathered <= 0 || s.Load != m.Params*e {
			t.Errorf("activations %d (checkpointing: %d), gathered %d, load %d", s.Activations, ckpt.Models[0].Activations, s.Gathered, s.Load)
		}
		root, layer := units[len(units)-1], max(units[0], units[1])
		want := (root + 2*layer) * e // the root and one layer, with the collective's copy of it
		if gather == "model" {
			want = m.Params * e
		}
		if s.RolloutGathered != want || (s.DecodeCopy > 0) != (gather == "model") {
			t.Errorf("rollout_gather %s: the rollout gathers %d bytes (want %d), decoding layout %d", gather, s.RolloutGathered, want, s.DecodeCopy)
		}
		d := pl.Devices[0]
		if d.PeakBytes < d.Load || d.PeakBytes <= one.Devices[0].PeakBytes/4 {
			t.Errorf("peak %d (load %d, one process %d)", d.PeakBytes, d.Load, one.Devices[0].PeakBytes)
		}
		t.Logf("rollout_gather %s, 4 ranks: static %d, update %d, rollout %d, peak %d (one process: static %d, peak %d)", gather, s.Static, s.Update, s.Rollout, d.PeakBytes, m.Static, one.Devices[0].PeakBytes)
	}
}
