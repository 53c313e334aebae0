package train

import (
	"fmt"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/shard"
	"github.com/drmas/drmas/pkg/torch"
)

// UsesCUDA reports whether any of the models (as WeightsOf gives them: an adapter on its base's
// device) will run on a CUDA device, device being the --device flag.
func UsesCUDA(models []model.Config, device string) bool {
	for _, m := range models {
		d := m.Device
		if d == "" {
			d = device
		}
		if dev, err := torch.ParseDevice(d); err == nil && dev.IsCuda() {
			return true
		}
	}
	return false
}

// RankDevice is the default device of one rank: with CUDA ("auto" finding it, or "cuda"), the GPU of
// its local rank, as torchrun's convention; an explicit cuda:N or cpu stays as it is.
func RankDevice(device string, localRank int) string {
	if device != "" && device != "auto" && device != "cuda" {
		return device
	}
	if d, err := torch.ParseDevice(device); err == nil && d.IsCuda() {
		return fmt.Sprintf("cuda:%d", localRank)
	}
	return device
}

// stopEverywhere makes the stop decision collective: every rank stops at the same iteration when
// any rank wants to (a signal, run.max_minutes).
func stopEverywhere(g *c10d.Group, stop bool) (bool, error) {
	if g.Size() == 1 {
		return stop, nil
	}
	v := []float64{0}
	if stop {
		v[0] = 1
	}
	if err := g.AllReduceFloats(v, c10d.Max); err != nil {
		return false, err
	}
	return v[0] > 0, nil
}

// syncModels broadcasts every model's weights from rank 0 and verifies them (torch thread); weights
// the strategy shards (dist.shard parameters) it keeps alike itself.
//
// The frozen bases of LoRA adapters too: the warm-up trains them on every rank.
func syncModels(par parallel, team *Team, models []*modelState) error {
	g := par.group()
	for _, mc := range team.Config.Models {
		if !team.Config.IsFrozenBase(mc.ID) || par.sharded(mc.ID) {
			continue
		}
		names, params := policy.SplitParams(team.Router[mc.ID].Model.Parameters())
		if err := shard.SyncWeights(g, names, params); err != nil {
			return fmt.Errorf("model %s (frozen base): %w", mc.ID, err)
		}
	}
	for _, ms := range models {
		if par.sharded(ms.id) {
			continue
		}
		if err := shard.SyncWeights(g, ms.names, ms.params); err != nil {
			return fmt.Errorf("model %s: %w", ms.id, err)
		}
	}
	return nil
}
