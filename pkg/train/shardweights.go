package train

import (
	"fmt"
	"sort"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// shardedWeights holds the models' weights sharded among the ranks (dist.shard: parameters): every
// full model — trained, a LoRA adapters' frozen base, a KL reference — cut into units of shards as
// soon as it is loaded (unitModel), the rounds that keep the ranks' passes over them in lockstep, and
// for each trained one the partition of its whole parameters that says which rank writes which
// tensor's optimizer state to a checkpoint. It is the weights half of the fsdp strategy, made
// before the team loads so that no rank ever holds two whole models at once.
type shardedWeights struct {
	g      *c10d.Group
	r      *rounds
	models map[string]*unitModel // by id
	parts  map[string]*partition // trained models
	hold   bool                  // dist.rollout_gather: model
}

// newShardedWeights is the sharded weights of a group under dist.shard: parameters; nil otherwise
// (one process, or another stage: whole weights).
func newShardedWeights(g *c10d.Group, d dist.Config) *shardedWeights {
	if g.Size() == 1 || d.Shard != dist.ShardParameters {
		return nil
	}
	return &shardedWeights{g: g, r: &rounds{g: g}, models: map[string]*unitModel{}, parts: map[string]*partition{},
		hold: d.RolloutGather == dist.GatherModel}
}

// adopt takes a whole model just loaded (trained: its shards will train; else a frozen base or a KL
// reference): every rank's weights made rank 0's (broadcast and checked), then cut into this rank's
// shards, the whole weights' memory given back. An adapter's view stays as it is (its base is
// adopted). Every rank adopts the same models in the same order. Torch thread.
func (w *shardedWeights) adopt(id string, m *policy.Model, trained bool) error {
	if w == nil || m.Base() != m {
		return nil
	}
	names, params := policy.SplitParams(m.Parameters())
	if err := syncWeights(w.g, names, params); err != nil {
		return fmt.Errorf("model %s: %w", id, err)
	}
	if trained {
		w.parts[id] = partitionOf(params, w.g.Size(), w.g.Rank())
	}
	w.models[id] = newUnitModel(id, m, w.g, w.r, trained, w.hold)
	torch.TrimMemory() // the whole weights are gone: give their pages back
	return nil
}

// state is what holds a trained sharded model's state on this rank: its units' shards (named
// shard.<unit>), which its optimizer steps; nil for a model kept whole (an adapter).
func (w *shardedWeights) state(model string) ([]string, []*ts.Tensor) {
	um := w.models[model]
	if um == nil || !um.trained {
		return nil, nil
	}
	var names []string
	var shards []*ts.Tensor
	for i, u := range um.units {
		names, shards = append(names, fmt.Sprintf("shard.%d", i)), append(shards, u.shard)
	}
	return names, shards
}

func (w *shardedWeights) sharded(model string) bool { return w.models[model] != nil }

func (w *shardedWeights) settle() error { return w.r.settle() }

func (w *shardedWeights) partition(model string) *partition { return w.parts[model] }

// whole runs fn with every sharded model whole on this rank (its passes gather nothing; trained ones
// with gradients), as every rank runs the format warm-up; then every rank takes rank 0's weights
// (broadcast and checked) and cuts its shards from them again.
func (w *shardedWeights) whole(fn func() error) error {
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
func (w *shardedWeights) ids() []string {
	ids := make([]string, 0, len(w.models))
	for id := range w.models {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// reference is a frozen copy of a model (its KL reference): of a sharded model, a model of the
// same shape whose shards are copies of this rank's. Torch thread.
func (w *shardedWeights) reference(model string, m *policy.Model) (*policy.Model, error) {
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
