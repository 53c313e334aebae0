package train

// Parameter sharding (dist.shard: parameters; docs/scale-out.md "Parameter sharding"), FSDP2's design
// over the c10d group of dataParallel:
//
//	weights     every model's weights are cut into units — each decoder layer, and the root
//	            (embeddings, final norm, lm_head) — and each unit, flattened and padded to a multiple
//	            of N, into N contiguous shards; rank r holds shard r of every unit of every model (a
//	            trained model, a LoRA adapters' frozen base, a KL reference): unitModel (units.go)
//	passes      a forward gathers the root, then each layer just before its forward and releases it
//	            right after; a training forward keeps the root for its backward, which gathers each
//	            layer again (recomputing it: a forward's graph would hold the gathered weights) and
//	            reduce-scatters its gradients into the shards as it leaves it. Passes are collectives,
//	            kept in lockstep across ranks doing different work by rounds (rounds.go)
//	state       the gradients and the AdamW state (float32 moments, and master weights for half
//	            dtypes) exist for the shards only: each rank steps its own shards, and nothing is
//	            broadcast after a step (the next gather takes the new shards)
//	adapters    a LoRA adapter trains replicated, as in plain data parallelism (its gradients
//	            all-reduced), on its sharded base
//
// Every norm is the root of the ranks' partial sums of squares (one all-reduce of one number), and
// every agent's share is measured exactly (dist.agent_norms approx changes nothing here: the
// gradients are reduced in the backward already, at no extra cost). Communication per optimizer step
// of a model of P parameters of b bytes, with m micro-batches per rank: each micro-batch gathers
// every unit twice (its forward, its backward: 2·P·b in) and reduces every unit's gradients once
// (emulated by an all-reduce: 2·P·b, a true reduce-scatter P·b); rollouts gather every unit at every
// decoding step unless dist.rollout_gather: model.

import (
	"fmt"
	"sort"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// placed is a model as the trainer hands it to its strategy: a trained model (its parameters: a
// full model's weights, an adapter's A and B matrices on its base's view) or a frozen base (params
// nil).
type placed struct {
	id     string
	m      *policy.Model
	params []*ts.Tensor
}

// fsdp is the parameter-sharding strategy: dataParallel with every model's weights in units of
// shards (unitModel), trained models' state on the shards alone, and adapters replicated.
type fsdp struct {
	*dataParallel
	r      *rounds
	models map[string]*unitModel // the sharded models by id: trained, frozen bases, KL references
	parts  map[string]*partition // trained sharded models: who writes which whole tensor's state
	hold   bool                  // dist.rollout_gather: model
}

// newFSDP cuts every placed model that is not an adapter's view into this rank's shards, after
// making every rank's weights rank 0's (broadcast and checked, as syncModels does for whole
// weights). Torch thread.
func newFSDP(dp *dataParallel, d dist.Config, ms []placed) (*fsdp, error) {
	p := &fsdp{dataParallel: dp, r: &rounds{g: dp.g}, models: map[string]*unitModel{}, parts: map[string]*partition{},
		hold: d.RolloutGather == dist.GatherModel}
	for _, pm := range ms {
		if pm.m.Base() != pm.m {
			continue // an adapter: replicated, on its base (placed too)
		}
		names, params := policy.SplitParams(pm.m.Parameters())
		if err := syncWeights(dp.g, names, params); err != nil {
			return nil, fmt.Errorf("model %s: %w", pm.id, err)
		}
		trained := pm.params != nil
		p.models[pm.id] = newUnitModel(pm.id, pm.m, dp.g, p.r, trained, p.hold)
		if trained {
			p.parts[pm.id] = partitionOf(params, dp.g.Size(), dp.g.Rank())
		}
	}
	torch.TrimMemory() // the whole weights are gone: give their pages back
	return p, nil
}

// state is what holds a trained sharded model's state on this rank: its units' shards (named
// shard.<unit>), which its optimizer steps; nil for a model kept whole (an adapter).
func (p *fsdp) state(model string) ([]string, []*ts.Tensor) {
	um := p.models[model]
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

func (p *fsdp) sharded(model string) bool { return p.models[model] != nil }

func (p *fsdp) settle() error { return p.r.settle() }

// gather settles the rollout's rounds, then exchanges the ranks' rollouts. Not on the torch thread.
func (p *fsdp) gather(local *env.Rollout, lo int) (*env.Rollout, error) {
	if err := torch.Do(p.settle); err != nil {
		return nil, err
	}
	return p.dataParallel.gather(local, lo)
}

// grads settles first: every rank has zeroed the gradients for the step before any rank's backward
// reduces into them (a rank still scoring its calls takes part in the others' backward passes).
func (p *fsdp) grads(_ string, params []*ts.Tensor) ([]*ts.Tensor, func()) {
	if err := p.settle(); err != nil {
		log.Fatal().Err(err).Msg("dist.shard parameters: settling before the backward")
	}
	return params, func() {}
}

// exactShares: a sharded model's gradients are reduced in the backward, so each agent's share is
// complete at no extra cost; an adapter's all-reduce per share is small.
func (p *fsdp) exactShares() bool { return true }

// reduce: a sharded model's gradients are reduced already (in the backward's rounds, which this
// settles); an adapter's are all-reduced.
func (p *fsdp) reduce(model string, params []*ts.Tensor) error {
	if err := p.settle(); err != nil || p.sharded(model) {
		return err
	}
	return p.dataParallel.reduce(model, params)
}

// norm is the norm of a complete gradient: a sharded model's from the ranks' shards.
func (p *fsdp) norm(model string, kept []*ts.Tensor) (float64, error) {
	if err := p.settle(); err != nil {
		return 0, err
	}
	if p.sharded(model) {
		return partNorm(p.g, kept)
	}
	return GradNorm(kept), nil
}

func (p *fsdp) sum(v []float64) error {
	if err := p.settle(); err != nil {
		return err
	}
	return p.dataParallel.sum(v)
}

func (p *fsdp) max(v []float64) error {
	if err := p.settle(); err != nil {
		return err
	}
	return p.dataParallel.max(v)
}

// step is AdamW on this rank's shards (or an adapter's whole state, alike on every rank): the next
// gather spreads the new weights.
func (p *fsdp) step(_ string, opt *optim.AdamW, _ []*ts.Tensor) error {
	if err := p.settle(); err != nil {
		return err
	}
	return adamwStep(opt)()
}

// partition: a sharded model's whole tensors, each written to the checkpoint by one owner.
func (p *fsdp) partition(model string) *partition { return p.parts[model] }

// whole runs fn with every sharded model whole on this rank (its passes gather nothing; trained ones
// with gradients), as every rank runs the format warm-up; then every rank takes rank 0's weights
// (broadcast and checked) and cuts its shards from them again.
func (p *fsdp) whole(fn func() error) error {
	ids := p.ids()
	err := torch.Do(func() error {
		for _, id := range ids {
			if err := p.models[id].pin(true); err != nil {
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
			um := p.models[id]
			if err == nil {
				err = um.sync()
			}
			um.unpin()
		}
		return err
	})
}

// ids are the sharded models' ids, sorted.
func (p *fsdp) ids() []string {
	ids := make([]string, 0, len(p.models))
	for id := range p.models {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// reference is a frozen copy of a model (its KL reference): of a sharded model, a model of the
// same shape whose shards are copies of this rank's. Torch thread.
func (p *fsdp) reference(model string, m *policy.Model) (*policy.Model, error) {
	um := p.models[model]
	if um == nil {
		return m.Clone()
	}
	ref, err := m.Shell()
	if err != nil {
		return nil, err
	}
	p.models[model+"-ref"] = um.copyTo(model+"-ref", ref)
	return ref, nil
}

// adopt cuts a frozen whole model (a KL reference read back on resume) into this rank's shards;
// an adapter's view stays as it is.
func (p *fsdp) adopt(id string, m *policy.Model) error {
	if m.Base() != m {
		return nil
	}
	p.models[id] = newUnitModel(id, m, p.g, p.r, false, p.hold)
	return nil
}

// elements counts the tensors' elements.
func elements(ts []*ts.Tensor) int64 {
	var n int64
	for _, t := range ts {
		n += int64(t.Numel())
	}
	return n
}
