package plan

import (
	"fmt"
	"slices"

	"github.com/drmas/drmas/pkg/arch"
)

// Parameter sharding (dist.shard: parameters; pkg/shard): each rank holds 1/N of every unit
// of every model — each decoder layer, and the root (embeddings, final norm, lm_head) — flattened
// and padded to a multiple of N, and gathers a unit whole only around its use.

// UnitSizes are the elements of a model's units: each decoder layer's weights, then the root's.
func UnitSizes(c arch.Config) ([]int64, error) {
	shapes, err := arch.Shapes(c)
	if err != nil {
		return nil, err
	}
	out := make([]int64, c.NumHiddenLayers+1)
	for _, w := range shapes {
		var i int
		var rest string
		if n, _ := fmt.Sscanf(w.Name, "model.layers.%d.%s", &i, &rest); n == 2 && i < c.NumHiddenLayers {
			out[i] += w.Numel()
		} else {
			out[c.NumHiddenLayers] += w.Numel()
		}
	}
	return out, nil
}

// shardsParameters says whether the plan is for parameter sharding over several ranks.
func (in input) shardsParameters() bool { return in.world > 1 && in.shard == "parameters" }

// glooThreads are the worker threads of a Gloo process group (scripts/torchsetup/c10d/drmas_c10d.cpp).
const glooThreads = 2

// unitShares are what sharding the units of a model of p parameters gives one rank: own, its shards'
// elements (Σ⌈unit/N⌉); root and layer, the root's and the largest layer's elements; most, the
// largest shard's.
func (in input) unitShares() (own, root, layer, most int64) {
	units, err := UnitSizes(in.cfg)
	if err != nil {
		return 0, 0, 0, 0
	}
	n := int64(in.world)
	for _, u := range units {
		per := (u + n - 1) / n
		own += per
		most = max(most, per)
	}
	root = units[len(units)-1]
	if len(units) > 1 {
		layer = slices.Max(units[:len(units)-1])
	}
	return own, root, layer, most
}

// sharded applies parameter sharding to a model's parts, when the plan is for it: a full model's
// (trained or frozen) become its shards' (shardedParts; an offloaded state the shards' too); an
// adapter keeps its own state whole (replicated) and gathers its base's units in its update.
func (in input) sharded(s *Parts, p int64) {
	if !in.shardsParameters() {
		return
	}
	_, root, layer, most := in.unitShares()
	if in.lora != nil {
		s.Gathered = (root + 2*layer) * in.e
		return
	}
	in.shardedParts(s, p, most)
	if in.offload {
		in.offloadShards(s, most)
	}
}

// shardedParts sets the parts of a model (trained or frozen) whose weights are sharded: this rank's
// shards of the weights, and of the gradients, master weights and AdamW moments when it trains; in
// the update the units in flight — the root, kept from the training forward to the end of its
// backward, and the layer at hand, each with its gradient buffer, plus the collective's flat copy of
// one layer (the list all-gather and reduce copy through one) — and the exact-share accumulator (the
// shards'); the rollout's gathered units (dist.rollout_gather unit: the root and one layer; model:
// the whole weights, which generation may then pack); the load, when the model is whole before it
// is cut.
func (in input) shardedParts(s *Parts, p, largestShard int64) {
	own, root, layer, _ := in.unitShares()
	s.Weights = own * in.e
	s.Load = p * in.e
	if in.gatherWhole {
		s.RolloutGathered = p * in.e
	} else {
		s.RolloutGathered = (root + 2*layer) * in.e
		s.DecodeCopy, s.DecodeHeap = 0, 0 // generation keeps the checkpoint layout, unit by unit
		if in.cpu {
			s.KVHeap += onHeap(root*in.e) + 2*onHeap(layer*in.e)
		}
	}
	if in.frozen {
		return
	}
	if in.master {
		s.Master = own * 4
	}
	s.Gradients = own * in.e
	s.Optimizer = own * 8
	s.Gathered = (2*root + 3*layer) * in.e
	s.Reduce = 0
	if in.exactShares {
		s.Reduce = own * in.e // the exact-share accumulator: a copy of the shards' gradients
	}
	if in.cpu {
		// The C heap keeps what every pass allocates again: the gathered units' buffers, the
		// accumulator's (a shard each), and the flat input (a shard) and output (a unit) that Gloo's
		// list all-gather copies through on each of its worker threads, whose heaps (glibc arenas of
		// their own) keep them (measured: the sharded 150M toy's peak was 10% above the plan without
		// them, docs/scale-out.md).
		unit := max(root, layer) * in.e
		s.Gathered += glooThreads * (unit + unit/int64(in.world))
		s.UpdateHeap += 2*onHeap(root*in.e) + 3*onHeap(layer*in.e) + glooThreads*(onHeap(unit)+onHeap(unit/int64(in.world)))
		if largestShard*in.e <= HeapBlockMax {
			s.UpdateHeap += s.Reduce
			s.Reduce = 0
		}
	}
	if in.kl {
		s.Reference = own * in.e
	}
	s.OptimStep = optimCopies * largestShard * 4
}

// offloadShards moves a sharded model's optimizer state to the host (models[].optim.offload: cpu):
// a float32 master copy of every shard and the moments, and the step's scratch there (with the
// gradient's host copy), as the whole model's are moved (share).
func (in input) offloadShards(s *Parts, most int64) {
	own, _, _, _ := in.unitShares()
	master, step := own*4, (optimCopies+1)*most*4
	if in.cpu {
		s.Master, s.OptimStep = master, step
		return
	}
	s.Offloaded, s.OffloadStep = master+own*8, step
	s.Master, s.Optimizer, s.OptimStep = 0, 0, 0
}
