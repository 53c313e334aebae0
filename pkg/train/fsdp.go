package train

// Parameter sharding (dist.shard: parameters; docs/scale-out.md "Parameter sharding"), FSDP2's design
// over the c10d group of dataParallel. The weights — every model cut into units of shards, and the
// passes that gather them in lockstep across the ranks — are pkg/shard's; this strategy is the
// step's collectives over them:
//
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
	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/shard"
	"github.com/drmas/drmas/pkg/torch"
)

// fsdp is the parameter-sharding strategy: dataParallel's collectives over the sharded weights w
// (pkg/shard), the trained models' state on their shards alone, and adapters replicated.
type fsdp struct {
	*dataParallel
	w *shard.Weights
}

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
		return partNorm(p.dataParallel.g, kept)
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
func (p *fsdp) partition(model string) *shard.Partition { return p.w.Partition(model) }

// The weights: pkg/shard's.

func (p *fsdp) state(model string) ([]string, []*ts.Tensor) { return p.w.State(model) }

func (p *fsdp) sharded(model string) bool { return p.w.Sharded(model) }

func (p *fsdp) settle() error { return p.w.Settle() }

func (p *fsdp) whole(fn func() error) error { return p.w.Whole(fn) }

func (p *fsdp) reference(model string, m *policy.Model) (*policy.Model, error) {
	return p.w.Reference(model, m)
}

func (p *fsdp) adopt(id string, m *policy.Model, trained bool) error {
	return p.w.Adopt(id, m, trained)
}

// writeOptim: a trained model's state gathered unit by unit (a collective); an adapter's
// (replicated) state is its own.
func (p *fsdp) writeOptim(model string, opt *optim.AdamW, path string, meta map[string]string) error {
	if !p.w.Trains(model) {
		return p.dataParallel.writeOptim(model, opt, path, meta)
	}
	return p.w.WriteOptim(model, opt, path, meta)
}

// restore: the part of each whole tensor that lies in this rank's shards; an adapter's is read whole.
func (p *fsdp) restore(model string, opt *optim.AdamW, dir string) error {
	if !p.w.Trains(model) {
		return p.dataParallel.restore(model, opt, dir)
	}
	return p.w.RestoreOptim(model, opt, dir)
}

// elements counts the tensors' elements.
func elements(ts []*ts.Tensor) int64 {
	var n int64
	for _, t := range ts {
		n += int64(t.Numel())
	}
	return n
}
