package plan

// The parts one model holds on its device, from the facts of its config.json and the run's settings.

import (
	"fmt"
	"slices"

	"github.com/drmas/drmas/pkg/arch"
)

// Parts is memory by what holds it, in bytes.
type Parts struct {
	Weights     int64 `json:"weights_bytes"`
	Master      int64 `json:"master_weights_bytes"`
	Gradients   int64 `json:"gradients_bytes"`
	Optimizer   int64 `json:"optimizer_bytes"`
	Reference   int64 `json:"reference_bytes"`
	Activations int64 `json:"activations_bytes"`    // what the layers keep for backward
	Attention   int64 `json:"attention_bytes"`      // the attention work space of one layer
	Logits      int64 `json:"logits_chunk_bytes"`   // one chunk of float32 logits
	OptimStep   int64 `json:"optimizer_step_bytes"` // AdamW's scratch for its largest parameter
	RolloutKV   int64 `json:"rollout_kv_bytes"`     // the KV cache of the largest Generate call
	DecodeCopy  int64 `json:"decode_copy_bytes"`    // CPU: the decoding layout of the weights
	// Reduce is data-parallel training's extra gradient memory during a model's update: the flat
	// all-reduce buffer, the exact-share accumulator (its partition under dist.shard: gradients),
	// and under gradients the reduced gradients of the parameters the rank does not own, which
	// backward needs whole.
	Reduce int64 `json:"reduce_bytes"`
	// Offloaded is the float32 master weights and AdamW moments that models[].optim.offload: cpu
	// keeps in host memory for a model on another device (its partition under dist.shard), and
	// OffloadStep the host scratch of its AdamW step (the gradient copied over and the temporaries):
	// a model's figures, which the host ("cpu") device's figures add up.
	Offloaded   int64 `json:"offloaded_bytes"`
	OffloadStep int64 `json:"offload_step_bytes"`
	// Under dist.shard parameters (pkg/plan/units.go): Gathered is the update's units in flight (the
	// root and one layer whole, with their gradient buffers, and the collective's flat copy of one
	// layer), RolloutGathered the rollout's gathered weights (one unit at a time, or every model
	// whole under dist.rollout_gather: model), and Load a whole model as it loads, before it is cut
	// into shards (the device's load phase: every model's shards and the largest whole model).
	Gathered        int64 `json:"gathered_units_bytes"`
	RolloutGathered int64 `json:"rollout_gathered_bytes"`
	Load            int64 `json:"load_bytes"`
	// Ahead is the host memory of the rollouts generated ahead of training (rollout.max_staleness K):
	// K rollouts' calls, heldTokenBytes per prompt and response token; the host ("cpu") device's.
	Ahead int64 `json:"rollouts_ahead_bytes"`
	// The C heap (CPU tensors up to HeapBlockMax; larger ones are mapped and given back when freed)
	// keeps what it served after a phase ends, resident, until pkg/torch.ReleaseMemory trims it
	// after the update: UpdateHeap is what of the update's activations, attention and logits it
	// serves, KVHeap and DecodeHeap what of the rollout's KV cache and decoding layout; Held their
	// sum (blocks of one phase do not fit the other's tensors: see heldPhases). StepMapped is the
	// optimizer step's scratch when mapped (its largest parameter's float32 copies past
	// HeapBlockMax), which lands on top of the held heap; else 0.
	UpdateHeap int64 `json:"update_heap_bytes"`
	KVHeap     int64 `json:"rollout_kv_heap_bytes"`
	DecodeHeap int64 `json:"decode_copy_heap_bytes"`
	Held       int64 `json:"heap_held_bytes"`
	StepMapped int64 `json:"optimizer_step_mapped_bytes"`
	Update     int64 `json:"update_bytes"`           // max(Activations + Attention + Logits, Held + StepOnHeld, OptimStep) + Reduce
	Rollout    int64 `json:"rollout_bytes"`          // RolloutKV + DecodeCopy
	Static     int64 `json:"static_bytes"`           // Weights + Master + Gradients + Optimizer + Reference + Offloaded + Ahead
	Overhead   int64 `json:"runtime_overhead_bytes"` // device: the runtime's own memory
}

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
	shard         string  // dist.shard: none | optimizer | gradients | parameters
	gatherWhole   bool    // dist.rollout_gather: model (parameters: the rollout holds every model whole)
	exactShares   bool    // several agents share the model or the guard is on, with exact norms
	offload       bool    // models[].optim.offload: cpu
	frozen        bool    // the frozen base of adapters: weights (and the rollout) only
	lora          []int64 // an adapter: its A and B tensors' sizes, the parameters it trains
}

// share computes a model's parts.
func (in input) share() Parts {
	sizes, p, largest := in.sizes()
	var s Parts
	if in.frozen {
		s.Weights = p * in.e
		in.rollout(&s, p)
		in.sharded(&s, p)
		s.total()
		return s
	}
	in.state(&s, sizes, p, largest)
	in.update(&s, largest)
	in.rollout(&s, p)
	in.sharded(&s, p)
	s.total()
	return s
}

// sizes are the elements of each tensor the model trains (an adapter: its A and B only), their sum
// and the largest (AdamW's scratch), from one pass over the weights' shapes.
func (in input) sizes() (sizes []int64, p, largest int64) {
	shapes, _ := arch.Shapes(in.cfg)
	sizes = make([]int64, len(shapes))
	for i, w := range shapes {
		sizes[i] = w.Numel()
	}
	if in.lora != nil { // an adapter trains its A and B only
		sizes = in.lora
	}
	for _, n := range sizes {
		p += n
		largest = max(largest, n)
	}
	return sizes, p, largest
}

// state sets the training state's parts of a model of p parameters: weights, master copy,
// gradients, AdamW moments and its step's scratch (on the host under optim.offload: cpu), the
// data-parallel reduction's buffers and the KL reference.
func (in input) state(s *Parts, sizes []int64, p, largest int64) {
	// Sharded (dist.shard): the rank holding the most elements of the partition (plan.Balance).
	own := p
	if in.world > 1 && (in.shard == "optimizer" || in.shard == "gradients") {
		_, load := Balance(sizes, in.world)
		own = slices.Max(load)
	}
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
}

// update sets the update's parts: the activations the layers keep for backward, one layer's
// attention work space and a chunk of logits, with what of them the C heap serves, and the optimizer
// step's scratch when it is mapped (largest: the largest parameter's elements).
func (in input) update(s *Parts, largest int64) {
	c := in.cfg
	h, L, H, K, D := int64(c.HiddenSize), int64(c.NumHiddenLayers), int64(c.NumAttentionHeads),
		int64(c.NumKeyValueHeads), int64(c.HeadDim)
	// Under a token budget a micro-batch holds rows × its longest row ≤ max(budget, t) padded tokens
	// (a call longer than the budget is a micro-batch of its own): as many rows of the longest length
	// as that allows, and every response token of them in the logits.
	b, logitTokens := in.b, in.b*in.r
	if in.budget > 0 {
		b = max(1, (max(in.budget, in.t)+in.t-1)/in.t)
		logitTokens = max(in.budget, in.t)
	}
	// A layer keeps tensors of three widths per token: the hidden size's, the intermediate size's and
	// q's and k/v's; each width's tensors are [b, t, width] of the weights' dtype.
	bt := b * in.t * in.e
	hTensor, qTensor, kvTensor := bt*h, bt*H*D, bt*K*D
	// What of it the heap serves (each tensor up to HeapBlockMax; larger ones are mapped): the part
	// the allocator keeps after the update (held, below).
	heapOnly := func(n int64) int64 { // CUDA has its own allocator
		if in.cpu {
			return onHeap(n)
		}
		return 0
	}
	// A mixture-of-experts layer's intermediate width is that of the experts a token runs through
	// (arch.ActiveInter), and it keeps the router's float32 probabilities [b·t, experts] and each
	// token's copies into its top-k experts and their outputs (hidden-sized, top-k of each).
	moe := arch.OptionsOf(c).MoE
	layer := func(i int64) (kept, held int64) {
		iTensor := bt * arch.ActiveInter(c, int(i))
		kept = ActHidden*hTensor + ActIntermediate*iTensor + ActAttention*(qTensor+2*kvTensor)
		held = ActHidden*heapOnly(hTensor) + ActIntermediate*heapOnly(iTensor) + ActAttention*(heapOnly(qTensor)+2*heapOnly(kvTensor))
		if moe.SparseLayer(int(i)) {
			router, copies := b*in.t*moe.Experts*4, 2*moe.TopK*hTensor
			kept += router + copies
			held += heapOnly(router) + 2*moe.TopK*heapOnly(hTensor)
		}
		return kept, held
	}
	var sumKept, sumHeld, maxKept, maxHeld int64
	for i := range L {
		k, hd := layer(i)
		sumKept, sumHeld, maxKept, maxHeld = sumKept+k, sumHeld+hd, max(maxKept, k), max(maxHeld, hd)
	}
	// While a layer's backward runs, its gradients are about as large as what it keeps: one more
	// layer's term (with checkpointing, the recomputed layer's and its gradients'). Sharded weights
	// are recomputed layer by layer in backward whatever the setting (pkg/policy/units.go).
	if in.checkpointing || in.shardsParameters() {
		s.Activations = L*hTensor + 2*maxKept
		s.UpdateHeap = L*heapOnly(hTensor) + 2*maxHeld
	} else {
		s.Activations = sumKept + maxKept
		s.UpdateHeap = sumHeld + maxHeld
	}
	tq := arch.AttentionTileRows(b, H, in.t, in.t, !in.cpu)
	tile := b * H * tq * in.t * 4 // one float32 [b, H, rows, t]
	s.Attention = attnCopies * tile
	s.UpdateHeap += attnCopies * heapOnly(tile)
	chunk := arch.LogitsChunkTokens(int64(c.VocabSize), logitTokens) * int64(c.VocabSize) * 4 // one float32 [rows, V]
	s.Logits = logitsCopies * chunk
	s.UpdateHeap += logitsCopies * heapOnly(chunk)
	if in.cpu && largest*4 > HeapBlockMax {
		// AdamW's float32 temporaries of the largest parameter are mapped: fresh pages, on top of
		// what the heap holds from the forward and backward before it.
		s.StepMapped = s.OptimStep
	}
}

// inFlight is the rows of generation in flight at most: rollout.max_batch, else every row of the
// largest call.
func (in input) inFlight() int64 {
	if in.maxBatch > 0 && in.maxBatch < in.rows {
		return in.maxBatch
	}
	return in.rows
}

// rowsFrom says where the rollout's rows come from: the training batch (batch_size × group_size,
// every trajectory's call of an agent in one Generate call) or validation's questions × val_k.
func (in input) rowsFrom() string {
	if in.batch*in.group >= in.valRows {
		return fmt.Sprintf("algorithm.batch_size %d × group_size %d", in.batch, in.group)
	}
	return fmt.Sprintf("validation: %d rows, its questions × run.val_k; run.val_limit lowers them", in.valRows)
}

// kvFrom says how kvPositions counts: rows × (prompt + response) tokens, or what bounds it.
func (in input) kvFrom() string {
	switch n := in.rows * in.t; {
	case in.kvTokens > 0 && in.kvTokens < n:
		return fmt.Sprintf("rollout.kv_tokens %d", in.kvTokens)
	case in.maxBatch > 0 && in.maxBatch < in.rows:
		return fmt.Sprintf("rollout.max_batch %d rows in flight × 2 × %d tokens", in.maxBatch, in.t)
	}
	return fmt.Sprintf("%d rows × %d tokens: %s, prompt + response", in.rows, in.t, in.rowsFrom())
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

// rollout sets the rollout's parts of a model of p parameters: the KV cache of the largest Generate
// call (a k and a v tensor [rows, K, t, D] per layer, or the continuous batch's slots: kvPositions) and, on a CPU, the decoding layout (pack in
// pkg/policy/packed.go: per layer q/k/v fused [h, (H+2K)·D], o, gate/up fused [h, 2I] and down, and
// lm_head [h, V]; counted as P·e), with what of each the C heap serves.
func (in input) rollout(s *Parts, p int64) {
	c := in.cfg
	h, L, H, K, D, I, V := int64(c.HiddenSize), int64(c.NumHiddenLayers), int64(c.NumAttentionHeads),
		int64(c.NumKeyValueHeads), int64(c.HeadDim), int64(c.IntermediateSize), int64(c.VocabSize)
	kv := K * D * in.e * in.kvPositions() // one layer's k (or v): the generation budget's positions
	s.RolloutKV = 2 * L * kv
	if !in.cpu || in.rows == 0 {
		return
	}
	s.KVHeap = 2 * L * onHeap(kv)
	s.DecodeCopy = p * in.e
	e := in.e
	s.DecodeHeap = onHeap(e * h * V)
	moe := arch.OptionsOf(c).MoE
	for i := range int(L) {
		s.DecodeHeap += onHeap(e*h*(H+2*K)*D) + onHeap(e*H*D*h)
		if moe.SparseLayer(i) { // each expert's gate/up and down, and the router
			s.DecodeHeap += moe.Experts*(onHeap(e*h*2*moe.Inter)+onHeap(e*moe.Inter*h)) + onHeap(e*h*moe.Experts)
		} else {
			s.DecodeHeap += onHeap(e*h*2*I) + onHeap(e*I*h)
		}
	}
}

// onHeap is n when a CPU tensor of n bytes comes from the C heap (at most HeapBlockMax), else 0.
func onHeap(n int64) int64 {
	if n <= HeapBlockMax {
		return n
	}
	return 0
}

// HeapBlockMax is the largest allocation the C heap serves on the CPU: pkg/torch tunes glibc's
// M_MMAP_THRESHOLD to it (its maximum, 32 MiB; a test in pkg/torch holds the two equal). A larger
// tensor is a mapping of its own, given back to the system when freed; a tensor up to it comes from
// the heap, which keeps it, once freed, for the next allocation instead of giving it back: memory
// freed below a live allocation stays resident until ReleaseMemory trims the heap, and that does
// not happen between steps of the same shape (trimming there made every step fault its memory
// back in, issue #12).
const HeapBlockMax = 32 << 20

func (s *Parts) total() {
	s.Static = s.Weights + s.Master + s.Gradients + s.Optimizer + s.Reference + s.Offloaded + s.Ahead
	// The update's peak: every activation alive in backward (with the sharded units in flight), or
	// the optimizer step after it — with the heap still holding the forward's and backward's memory
	// under a mapped step scratch.
	s.Update = max(s.Activations+s.Attention+s.Logits+s.Gathered, s.UpdateHeap+s.StepMapped, s.OptimStep) + s.Reduce
	s.Rollout = s.RolloutKV + s.DecodeCopy + s.RolloutGathered
	s.Held = s.UpdateHeap + s.KVHeap + s.DecodeHeap
}

// heldPhases is the peak of the phases over the heap's high-water mark. The C heap keeps what it
// served, resident, until ReleaseMemory trims it after the update, and a freed block serves only a
// tensor that fits it: the rollout's blocks (the layout's matrices, each layer's k and v) do not
// take the update's activations, nor the other way round (measured: a Qwen3-0.6B-shaped team's
// heap held 6.6 GB free after its update, its rollout's and its micro-batches' blocks side by side).
// So Held is the rollout's and the update's heap memory together, and each phase adds its mapped
// tensors on top: the update's activations, attention and logits the heap did not serve (with the
// gradient reduction's buffers), the optimizer step's mapped scratch, the rollout's mapped KV cache
// and layout. 0 on CUDA (nothing held).
func (s Parts) heldPhases() int64 {
	if s.Held == 0 {
		return 0
	}
	update := s.Activations + s.Attention + s.Logits + s.Gathered - s.UpdateHeap
	rollout := s.RolloutKV - s.KVHeap + s.DecodeCopy - s.DecodeHeap + s.RolloutGathered
	return s.Held + max(update+s.Reduce, s.StepMapped+s.Reduce, rollout)
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
