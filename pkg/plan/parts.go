package plan

// The parts one model holds on its device, from the facts of its config.json and the run's settings.

import (
	"slices"

	"github.com/drmas/drmas/pkg/arch"
)

// input is what a model's share is computed from.
type input struct {
	cfg           arch.Config
	e             int64 // bytes per element of the weights' dtype
	master        bool  // AdamW keeps a float32 master copy (any dtype but float32: pkg/optim/adamw.go)
	kl            bool  // a frozen reference for the KL penalty
	checkpointing bool
	b, t, r       int64 // micro-batch, tokens per sequence, response tokens per sequence
	p             int64 // the longest prompt of its agents (t ≤ p + r)
	agents        []int // the agents (indices in agents[]) whose calls it trains
	budget        int64 // padded tokens per micro-batch (max_tokens_per_micro_batch; 0: b sequences)
	rows          int64 // rollout rows (0: a remote engine)
	batch, group  int64 // algorithm.batch_size and group_size (rows = max(batch × group, valRows))
	valRows       int64 // validation's rows
	maxBatch      int64 // rollout.max_batch: rows in flight at most (0: every row of a call at once)
	kvTokens      int64 // rollout.kv_tokens: KV-cache positions at most (0: no bound)
	cpu           bool
	world         int     // data-parallel ranks (≤ 1: one process)
	shard         string  // dist.shard: none | optimizer | gradients
	exactShares   bool    // several agents share the model or the guard is on, with exact norms
	offload       bool    // models[].optim.offload: cpu
	frozen        bool    // the frozen base of adapters: weights (and the rollout) only
	lora          []int64 // an adapter: its A and B tensors' sizes, the parameters it trains
}

// share computes a model's parts.
func (in input) share() Parts {
	c := in.cfg
	// One pass over the weights' shapes: their count, and the largest (AdamW's scratch, below).
	shapes, _ := arch.Shapes(c)
	sizes := make([]int64, len(shapes))
	for i, w := range shapes {
		sizes[i] = w.Numel()
	}
	if in.lora != nil { // an adapter trains its A and B only
		sizes = in.lora
	}
	var p, largest int64
	for _, n := range sizes {
		p += n
		largest = max(largest, n)
	}
	if in.frozen {
		var s Parts
		s.Weights = p * in.e
		s.RolloutKV = 2 * int64(c.NumHiddenLayers) * int64(c.NumKeyValueHeads) * int64(c.HeadDim) * in.e * in.kvPositions()
		if in.cpu && in.rows > 0 {
			s.DecodeCopy = p * in.e
		}
		s.total()
		return s
	}
	h, L, H, K, D, I := int64(c.HiddenSize), int64(c.NumHiddenLayers), int64(c.NumAttentionHeads),
		int64(c.NumKeyValueHeads), int64(c.HeadDim), int64(c.IntermediateSize)
	// Sharded (dist.shard): the rank holding the most elements of the partition (plan.Balance).
	own := p
	if in.world > 1 && (in.shard == "optimizer" || in.shard == "gradients") {
		_, load := Balance(sizes, in.world)
		own = slices.Max(load)
	}
	var s Parts
	s.Weights = p * in.e
	if in.master {
		s.Master = own * 4
	}
	s.Gradients = p * in.e
	s.Optimizer = own * 8
	if in.world > 1 {
		s.Reduce = p * in.e // the flat all-reduce buffer
		acc := p
		if in.shard == "gradients" {
			s.Gradients = own * in.e
			s.Reduce += (p - own) * in.e
			acc = own
		}
		if in.exactShares {
			s.Reduce += acc * in.e
		}
	}
	if in.kl {
		s.Reference = p * in.e
	}
	// AdamW updates one parameter at a time (pkg/optim/adamw.go) with a few float32 temporaries of
	// its size alive at once (g², the denominator; g in float32 for half weights).
	s.OptimStep = optimCopies * largest * 4
	if in.offload {
		// The state in host memory: a float32 master copy of every owned parameter (float32 ones
		// too: the step runs on the host) and the moments; the step's scratch there has the
		// gradient's host copy besides. On the CPU the device is the host: only the copy is new.
		master, step := own*4, (optimCopies+1)*largest*4
		if in.cpu {
			s.Master, s.OptimStep = master, step
		} else {
			s.Offloaded, s.OffloadStep = master+s.Optimizer, step
			s.Master, s.Optimizer, s.OptimStep = 0, 0, 0
		}
	}
	// Under a token budget a micro-batch holds rows × its longest row ≤ max(budget, t) padded tokens
	// (a call longer than the budget is a micro-batch of its own): as many rows of the longest length
	// as that allows, and every response token of them in the logits.
	b, logitTokens := in.b, in.b*in.r
	if in.budget > 0 {
		b = max(1, (max(in.budget, in.t)+in.t-1)/in.t)
		logitTokens = max(in.budget, in.t)
	}
	perLayer := b * in.t * (ActHidden*h + ActIntermediate*I + ActAttention*(H+2*K)*D) * in.e
	// While a layer's backward runs, its gradients are about as large as what it keeps: one more
	// layer's term (with checkpointing, the recomputed layer's and its gradients').
	if in.checkpointing {
		s.Activations = L*b*in.t*h*in.e + 2*perLayer
	} else {
		s.Activations = (L + 1) * perLayer
	}
	tq := arch.AttentionTileRows(b, H, in.t, in.t, !in.cpu)
	s.Attention = attnCopies * b * H * tq * in.t * 4
	s.Logits = arch.LogitsChunkTokens(int64(c.VocabSize), logitTokens) * int64(c.VocabSize) * 4 * logitsCopies
	s.RolloutKV = 2 * L * K * D * in.e * in.kvPositions()
	if in.cpu && in.rows > 0 {
		s.DecodeCopy = p * in.e
	}
	s.total()
	return s
}

// kvPositions is the most positions (rows × columns) the rollout's KV cache holds: the largest
// Generate call's rows of t columns when they all run at once; with rollout.max_batch below the
// call's rows, max_batch slots of up to 2t columns (continuous batching, pkg/policy/continuous.go:
// the cache spans from the oldest live row's first column to the furthest a newcomer may write,
// each less than t from the current column); rollout.kv_tokens caps it, down to the one row that
// always runs (t).
func (in input) kvPositions() int64 {
	n := in.rows * in.t
	if in.maxBatch > 0 && in.maxBatch < in.rows {
		n = in.maxBatch * 2 * in.t
	}
	if in.kvTokens > 0 {
		n = min(n, max(in.kvTokens, in.t))
	}
	return n
}

func (s *Parts) total() {
	s.Static = s.Weights + s.Master + s.Gradients + s.Optimizer + s.Reference + s.Offloaded + s.Ahead
	s.Update = max(s.Activations+s.Attention+s.Logits, s.OptimStep) + s.Reduce
	s.Rollout = s.RolloutKV + s.DecodeCopy
}

// Step is the plan of one training step of model c alone, as drmas bench takes it: weights of
// dtypeBytes per element with gradients and AdamW state (a float32 master copy for other dtypes),
// the activations of b sequences of t tokens of which r are response tokens, on the CPU or not (the
// runtime's overhead then counts). Its Update and Static add up to the step's peak.
func Step(c arch.Config, dtypeBytes, b, t, r int64, checkpointing, cpu bool) Parts {
	in := input{cfg: c, e: dtypeBytes, master: dtypeBytes != 4, checkpointing: checkpointing, b: b, t: t, r: r, cpu: cpu}
	s := in.share()
	s.Overhead = CUDAOverhead
	if cpu {
		s.Overhead = CPUOverhead
	}
	return s
}
