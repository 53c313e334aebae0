package shard

import (
	"fmt"
	"maps"
	"slices"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// Weights holds the models' weights sharded among the ranks (dist.shard: parameters): every full
// model — trained, a LoRA adapters' frozen base, a KL reference — cut into units of shards as soon
// as it is loaded (unitModel), the rounds that keep the ranks' passes over them in lockstep, and for
// each trained one the partition of its whole parameters that says which rank writes which tensor's
// optimizer state to a checkpoint. It is the weights half of pkg/train's fsdp strategy, made before
// the team loads so that no rank ever holds two whole models at once.
type Weights struct {
	g      *c10d.Group
	r      *rounds
	models map[string]*unitModel // by id
	parts  map[string]*Partition // trained models
	hold   bool                  // dist.rollout_gather: model
}

// New is the sharded weights of a group under dist.shard: parameters; nil otherwise (one process, or
// another stage: whole weights).
func New(g *c10d.Group, d dist.Config) *Weights {
	if g.Size() == 1 || d.Shard != dist.ShardParameters {
		return nil
	}
	return &Weights{g: g, r: &rounds{g: g}, models: map[string]*unitModel{}, parts: map[string]*Partition{},
		hold: d.RolloutGather == dist.GatherModel}
}

// Adopt takes a whole model just loaded (trained: its shards will train; else a frozen base or a KL
// reference): every rank's weights made rank 0's (broadcast and checked), then cut into this rank's
// shards, the whole weights' memory given back. An adapter's view stays as it is (its base is
// adopted). Every rank adopts the same models in the same order. Nil Weights adopt nothing. Torch
// thread.
func (w *Weights) Adopt(id string, m *policy.Model, trained bool) error {
	if w == nil || m.Base() != m {
		return nil
	}
	names, params := policy.SplitParams(m.Parameters())
	if err := SyncWeights(w.g, names, params); err != nil {
		return fmt.Errorf("model %s: %w", id, err)
	}
	if trained {
		w.parts[id] = PartitionOf(params, w.g.Size(), w.g.Rank())
	}
	w.models[id] = newUnitModel(id, m, w.g, w.r, trained, w.hold)
	torch.TrimMemory() // the whole weights are gone: give their pages back
	return nil
}

// State is what holds a trained sharded model's state on this rank: its units' shards (named
// shard.<unit>), which its optimizer steps; nil for a model kept whole (an adapter).
func (w *Weights) State(model string) ([]string, []*ts.Tensor) {
	if !w.Trains(model) {
		return nil, nil
	}
	var names []string
	var shards []*ts.Tensor
	for i, u := range w.models[model].units {
		names, shards = append(names, fmt.Sprintf("shard.%d", i)), append(shards, u.shard)
	}
	return names, shards
}

// Sharded says whether this rank holds only a shard of the model's weights.
func (w *Weights) Sharded(model string) bool { return w.models[model] != nil }

// Trains says whether the model is sharded and its shards train (not a frozen base or a reference).
func (w *Weights) Trains(model string) bool {
	um := w.models[model]
	return um != nil && um.trained
}

// Settle meets the other ranks once each has finished its passes over sharded models (rounds.go):
// before any collective outside them, where ranks may have worked apart. Torch thread.
func (w *Weights) Settle() error { return w.r.settle() }

// Partition is a trained model's partition of whole parameters: which rank writes which tensor's
// optimizer state to a checkpoint (nil: the model is not trained here sharded).
func (w *Weights) Partition(model string) *Partition { return w.parts[model] }

// Whole runs fn with every sharded model whole on this rank (its passes gather nothing; trained ones
// with gradients), as every rank runs the format warm-up; then every rank takes rank 0's weights
// (broadcast and checked) and cuts its shards from them again.
func (w *Weights) Whole(fn func() error) error {
	ids := w.ids()
	err := torch.Do(func() error {
		for _, id := range ids {
			if err := w.models[id].pin(true); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = fn()
	}
	return torch.Do(func() error {
		for _, id := range ids {
			um := w.models[id]
			if err == nil {
				err = um.sync()
			}
			um.unpin()
		}
		return err
	})
}

// ids are the sharded models' ids, sorted.
func (w *Weights) ids() []string {
	return slices.Sorted(maps.Keys(w.models))
}

// Reference is a frozen copy of a model (its KL reference): of a sharded model, a model of the
// same shape whose shards are copies of this rank's. Torch thread.
func (w *Weights) Reference(model string, m *policy.Model) (*policy.Model, error) {
	um := w.models[model]
	if um == nil {
		return m.Clone()
	}
	ref, err := m.Shell()
	if err != nil {
		return nil, err
	}
	w.models[model+"-ref"] = um.copyTo(model+"-ref", ref)
	return ref, nil
}

// SyncWeights broadcasts every parameter from rank 0 and checks that all ranks then hold the same
// values (weights start identical; a failed check names the tensor).
func SyncWeights(g *c10d.Group, names []string, params []*ts.Tensor) error {
	if g.Size() == 1 {
		return nil
	}
	return torch.NoGrad(func() error {
		if err := g.Broadcast(params, 0); err != nil {
			return err
		}
		return g.Verify(names, params)
	})
}
