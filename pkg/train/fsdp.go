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
	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/torch"
)

// fsdp is the parameter-sharding strategy: dataParallel's collectives over the shardedWeights
// (shardweights.go), the trained models' state on their shards alone, and adapters replicated.
type fsdp struct {
	*dataParallel
	*shardedWeights
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
func (p *fsdp) partition(model string) *partition { return p.shardedWeights.partition(model) }

// elements counts the tensors' elements.
func elements(ts []*ts.Tensor) int64 {
	var n int64
	for _, t := range ts {
		n += int64(t.Numel())
	}
	return n
}
