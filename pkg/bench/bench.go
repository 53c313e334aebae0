package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/microbatch"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// Preset returns the configuration of a named random-init Qwen2 model for benchmarks and toy runs:
// "tiny" (hidden 256, 4 layers, 4 heads) or "small" (hidden 512, 8 layers, 8 heads), both with
// vocabulary 512, two query heads per key/value head, an MLP four times as wide and tied embeddings;
// "long" is small with an MLP of 264 (9.8M parameters, attention a large share of a long
// sequence's work) and 32,768 positions, for long-sequence benchmarks.
func Preset(name string) (arch.Config, error) {
	c := arch.Config{ModelType: arch.Qwen2, VocabSize: 512, TieWordEmbeddings: true, MaxPositionEmbeddings: 4096,
		RopeTheta: 1e6, TorchDType: "float32"}
	switch name {
	case "tiny":
		c.HiddenSize, c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads = 256, 4, 4, 2
	case "small", "long":
		c.HiddenSize, c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads = 512, 8, 8, 4
	default:
		return arch.Config{}, fmt.Errorf("preset %q: want tiny, small or long", name)
	}
	c.IntermediateSize = 4 * c.HiddenSize
	if name == "long" {
		c.IntermediateSize, c.MaxPositionEmbeddings = 264, 32768
	}
	c.FillDefaults()
	return c, c.Validate()
}

// Options sets up Run.
type Options struct {
	Batch, PromptLen, ResponseLen int
	Steps                         int   // timed training steps (after the warm-up steps)
	WarmupSteps                   int   // untimed training steps first; < 0: none (0: the default, one)
	Checkpointing                 bool  // training steps recompute each layer in backward (gradient checkpointing)
	NoGenerate                    bool  // time the training step only
	MatmulSize                    int64 // side of the calibration matmul (default 2048)
	Seed                          int64
	// Profile, when set, runs around the timed generation (start and stop a CPU profile).
	Profile func() (stop func())
	// LoRAAdapters > 0 trains that many LoRA adapters (rank LoRARank, alpha 2·rank, on
	// LoRATargets, default every projection) on the model frozen instead of the model itself: a
	// training step is one step of each adapter (TrainScore on the adapted view, backward, its own
	// AdamW), as drmas train takes them for agents on adapters of one base (issue #27).
	LoRAAdapters, LoRARank int
	LoRATargets            []string
	// ResponseLengths, when set, gives response i ResponseLengths[i mod n] tokens (scored, and
	// generated) instead of ResponseLen.
	ResponseLengths []int
	// The training step's micro-batches (pkg/microbatch, as drmas train cuts them): MicroBatch
	// sequences each in order, each padded to its longest (≤ 0: the whole batch in one), or, with
	// MaxTokensPerMicroBatch > 0, sorted by length and packed within that many padded tokens. The
	// loss is the token-mean over the whole batch, so every cut takes the same step.
	MicroBatch, MaxTokensPerMicroBatch int
	// Pack, with MaxTokensPerMicroBatch > 0, packs the sequences instead: each micro-batch is one
	// row of up to that many real tokens, its sequences one after the other under a block-diagonal
	// causal mask (microbatch.Pack, policy.Model.TrainScorePacked), no padding.
	Pack bool
	// Generation: GenPrompts prompts (0: Batch) through GenBatch rows in flight (0: all), with
	// continuous batching unless StaticGen; GenLengths, when set, is each prompt's response length
	// (else ResponseLengths, else ResponseLen): generation stops at it (no stop tokens), so every
	// response is that long.
	GenPrompts, GenBatch int
	StaticGen            bool
	GenLengths           []int
}

// responseLen is sequence i's response length.
func (o Options) responseLen(i int) int {
	if len(o.ResponseLengths) > 0 {
		return o.ResponseLengths[i%len(o.ResponseLengths)]
	}
	return o.ResponseLen
}

// Result holds Run's figures. FLOPs are estimates: every matmul of the forward (q/k/v/o,
// MLP, lm_head on the positions that need it, and attention's q·kᵀ and p·v over all key positions,
// as computed), times three for a training step (backward ≈ twice the forward).
type Result struct {
	Params         int64   `json:"params"`
	Device         string  `json:"device"`
	DType          string  `json:"dtype"`
	Threads        int     `json:"threads"`         // libtorch intra-op threads
	InteropThreads int     `json:"interop_threads"` // libtorch inter-op threads
	BLASThreads    int     `json:"blas_threads"`    // threads of the float32 matrix products (-1: a BLAS other than OpenBLAS)
	GEMM           string  `json:"gemm"`            // library of the float32 CPU matrix products: onednn or blas
	Attention      string  `json:"attention"`       // fused (libtorch's scaled_dot_product_attention where it applies) or tiles
	Allocator      string  `json:"allocator"`       // C allocator: glibc or tcmalloc
	MatmulGFLOPS   float64 `json:"matmul_gflops"`   // n×n float32 matmul (n = MatmulSize), for calibration
	TrainMsPerStep float64 `json:"train_ms_per_step"`
	// TrainCPUMsPerStep is the process's CPU time (user + system) per timed training step: the work,
	// whatever share of the cores other processes took (wall time is not, on a shared machine).
	TrainCPUMsPerStep float64 `json:"train_cpu_ms_per_step"`
	TrainTokensPerSec float64 `json:"train_tokens_per_s"`
	TrainGFLOPS       float64 `json:"train_gflops"`
	TrainPeakRSSMB    float64 `json:"train_peak_rss_mb"`  // the process's peak resident memory at the end of the training steps
	GenSeconds        float64 `json:"gen_seconds"`        // one Generate call: prefill + response_len steps
	GenTokensPerSec   float64 `json:"gen_tokens_per_s"`   // generated tokens / GenSeconds
	GenCPUSeconds     float64 `json:"gen_cpu_seconds"`    // the process's CPU time (user + system) over that call: the work, on a shared machine
	DecodeMsPerStep   float64 `json:"decode_ms_per_step"` // per decoding step (all rows), timed around the steps: prefill and packing excluded
	DecodeSteps       int     `json:"decode_steps"`       // decoding steps of the timed call (gen_tokens / decode_steps: rows per step, about)
	GenGFLOPS         float64 `json:"gen_gflops"`
	GenPrompts        int     `json:"gen_prompts"`    // prompts generated
	GenBatch          int     `json:"gen_batch"`      // rows in flight at most (0: all)
	GenContinuous     bool    `json:"gen_continuous"` // continuous batching (false: static batches)
	GenTokens         int     `json:"gen_tokens"`     // tokens generated (the sum of the response lengths)
	// With LoRAAdapters: the adapters' parameters (each), one adapter folder's bytes on disk (what a
	// serving engine is sent per iteration and adapter: adapter_config.json and
	// adapter_model.safetensors) and the model's weight bytes (what a full-model sync sends).
	LoRAAdapters       int   `json:"lora_adapters,omitempty"`
	LoRARank           int   `json:"lora_rank,omitempty"`
	AdapterParams      int64 `json:"adapter_params,omitempty"`
	AdapterFolderBytes int64 `json:"adapter_folder_bytes,omitempty"`
	ModelWeightBytes   int64 `json:"model_weight_bytes"`
	// The training step's micro-batches (Options.MicroBatch, MaxTokensPerMicroBatch), and the
	// fraction of their padded positions (Σ rows × longest row) that are padding.
	MicroBatches    int     `json:"micro_batches"`
	TrainPadding    float64 `json:"train_padding"`
	TrainRealTokens int     `json:"train_real_tokens"` // prompt + response tokens of the batch
}

// Run measures a training step (Score with grad on B sequences of prompt+response tokens, token-mean
// loss on the response log-probs, backward, an AdamW update) and KV-cache generation of
// ResponseLen tokens for B prompts, on m. It enters torch.Do itself: call it from outside.
func Run(m *policy.Model, o Options) (Result, error) {
	if o.Batch <= 0 || o.PromptLen <= 0 || o.ResponseLen <= 0 {
		return Result{}, fmt.Errorf("bench: batch, prompt length and response length must be > 0")
	}
	if o.Steps <= 0 {
		o.Steps = 3
	}
	if o.MatmulSize <= 0 {
		o.MatmulSize = 2048
	}
	r := Result{Params: m.NumParams(), Device: torch.DeviceString(m.Device()), DType: policy.DTypeName(m.DType())}
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 7))
	seqs := make([]policy.Sequence, o.Batch)
	prompts := make([][]int, o.Batch)
	for i := range seqs {
		for range o.PromptLen {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(m.Config.VocabSize))
		}
		for range o.responseLen(i) {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(m.Config.VocabSize))
		}
		prompts[i] = seqs[i].PromptIDs
	}
	err := torch.Do(func() error {
		th := torch.CurrentThreads()
		r.Threads, r.InteropThreads, r.BLASThreads, r.Allocator = th.IntraOp, th.InterOp, th.BLAS, torch.Allocator()
		r.GEMM = torch.GEMM()
		r.Attention = "tiles"
		if policy.FusedAttention() {
			r.Attention = "fused"
		}
		r.MatmulGFLOPS = MatmulGFLOPS(m.Device(), o.MatmulSize)
		for _, p := range m.Parameters() {
			r.ModelWeightBytes += int64(p.T.Numel()) * int64(m.DType().Size())
		}
		if o.LoRAAdapters > 0 {
			return benchLoRA(m, seqs, o, &r)
		}
		return benchTrain(m, seqs, o, &r)
	})
	if err != nil {
		return r, err
	}
	r.TrainPeakRSSMB = float64(torch.PeakResidentBytes()) / (1 << 20)
	if o.NoGenerate {
		return r, nil
	}
	return r, benchGenerate(m, prompts, o, &r)
}

// benchLoRA times training steps of o.LoRAAdapters adapters on m, frozen, and measures an adapter
// folder's size. It runs on the torch thread.
func benchLoRA(m *policy.Model, seqs []policy.Sequence, o Options, r *Result) error {
	m.Freeze()
	defer m.Thaw()
	type group struct {
		view    *policy.Model
		tensors []*ts.Tensor
		opt     *optim.AdamW
	}
	var groups []group
	targets := o.LoRATargets
	if len(targets) == 0 {
		targets = []string{arch.LoRAAllLinear}
	}
	for i := range o.LoRAAdapters {
		a, err := policy.NewAdapter(m, fmt.Sprintf("agent%d", i), policy.LoRAConfig{Rank: o.LoRARank, Alpha: float64(2 * o.LoRARank), Targets: targets}, m.DType(), o.Seed+int64(i))
		if err != nil {
			return err
		}
		defer a.Free()
		v, err := m.WithAdapter(a)
		if err != nil {
			return err
		}
		names, tensors := policy.SplitParams(a.Parameters())
		opt := optim.NewAdamW(names, tensors, optim.AdamWOptions{LR: 1e-4, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
		defer opt.Free()
		groups = append(groups, group{v, tensors, opt})
		r.AdapterParams = a.NumParams()
	}
	r.LoRAAdapters, r.LoRARank = o.LoRAAdapters, o.LoRARank
	step := func() error {
		for _, g := range groups {
			err := func() error {
				s := torch.NewScope()
				defer s.Close()
				sc, bp, err := g.view.TrainScore(seqs, false, o.Checkpointing)
				if err != nil {
					return err
				}
				loss := sc.LogProbs.MustSum(gotch.Invalid, false).MustDiv(sc.Mask.MustSum(gotch.Invalid, false), true).MustNeg(true)
				bp.Backward(loss)
				g.opt.Apply(g.opt.CurrentLR())
				return torch.NoGrad(func() error {
					for _, t := range g.tensors {
						if gr := t.MustGrad(false); gr.MustDefined() {
							gr.MustZero_()
						}
					}
					return nil
				})
			}()
			if err != nil {
				return err
			}
			torch.ReleaseMemory()
		}
		return nil
	}
	sec, err := timeTrainSteps(o, r, step)
	if err != nil {
		return err
	}
	r.TrainMsPerStep = sec * 1000
	for i := range seqs {
		r.TrainRealTokens += len(seqs[i].PromptIDs) + len(seqs[i].ResponseIDs)
	}
	r.MicroBatches = 1
	r.TrainTokensPerSec = float64(o.LoRAAdapters*r.TrainRealTokens) / sec
	dir, err := os.MkdirTemp("", "drmas-bench-adapter-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := groups[0].view.Adapter().Save(dir); err != nil {
		return err
	}
	for _, f := range []string{policy.AdapterConfigFile, policy.AdapterWeightsFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		r.AdapterFolderBytes += st.Size()
	}
	return nil
}

// benchTrain times training steps on seqs. It runs on the torch thread.
func benchTrain(m *policy.Model, seqs []policy.Sequence, o Options, r *Result) error {
	// The optimizer drmas train takes (float32 moments, a float32 master copy of half weights).
	params := m.Parameters()
	names, tensors := make([]string, len(params)), make([]*ts.Tensor, len(params))
	for i, p := range params {
		names[i], tensors[i] = p.Name, p.T
	}
	opt := optim.NewAdamW(names, tensors, optim.AdamWOptions{LR: 1e-5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01})
	defer opt.Free()
	lengths := make([]int, len(seqs))
	for i, q := range seqs {
		lengths[i] = len(q.PromptIDs) + len(q.ResponseIDs)
		r.TrainRealTokens += lengths[i]
	}
	mbs := microbatch.Split(lengths, o.MicroBatch, o.MaxTokensPerMicroBatch)
	pack := o.Pack && o.MaxTokensPerMicroBatch > 0
	if pack {
		mbs = microbatch.Pack(lengths, o.MaxTokensPerMicroBatch)
	}
	r.MicroBatches, r.TrainPadding = len(mbs), microbatch.Padding(lengths, mbs)
	if pack {
		r.TrainPadding = 0 // one row a micro-batch: no padding
	}
	responseTokens := 0
	for i := range seqs {
		responseTokens += o.responseLen(i)
	}
	denom := ts.FloatScalar(float64(responseTokens))
	step := func() error {
		var sum float64
		for _, idx := range mbs {
			part := make([]policy.Sequence, len(idx))
			for j, i := range idx {
				part[j] = seqs[i]
			}
			err := func() error {
				s := torch.NewScope()
				defer s.Close()
				score := m.TrainScore
				if pack {
					score = func(seqs []policy.Sequence, withEntropy, checkpoint bool) (policy.Scores, *policy.Backprop, error) {
						return m.TrainScorePacked(seqs, nil, withEntropy, checkpoint)
					}
				}
				sc, bp, err := score(part, false, o.Checkpointing)
				if err != nil {
					return err
				}
				// the token-mean over the whole batch: each micro-batch's sum over the batch's tokens
				loss := sc.LogProbs.MustMul(sc.Mask.MustTotype(sc.LogProbs.DType(), false), false).MustSum(gotch.Invalid, true).MustDivScalar(denom, true).MustNeg(true)
				bp.Backward(loss)
				sum += loss.Float64Values()[0]
				return nil
			}()
			if err != nil {
				return err
			}
		}
		opt.Apply(opt.CurrentLR())
		_ = torch.NoGrad(func() error {
			for _, t := range tensors {
				if g := t.MustGrad(false); g.MustDefined() {
					g.MustZero_()
				}
			}
			return nil
		})
		if math.IsNaN(sum) {
			return fmt.Errorf("bench: loss is NaN")
		}
		torch.ReleaseMemory() // as the training loop does: trims only past a threshold
		return nil
	}
	sec, err := timeTrainSteps(o, r, step)
	if err != nil {
		return err
	}
	r.TrainMsPerStep = sec * 1000
	r.TrainTokensPerSec = float64(r.TrainRealTokens) / sec
	var flops float64
	for _, idx := range mbs { // the padded work each micro-batch's forward does
		longest, resp := 0, 0
		for _, i := range idx {
			longest, resp = max(longest, lengths[i]), max(resp, o.responseLen(i))
		}
		flops += forwardFLOPs(m.Config, len(idx), longest, 0, resp)
	}
	r.TrainGFLOPS = 3 * flops / sec / 1e9
	return nil
}

// benchGenerate times generation from prompts: one call for ResponseLen tokens (after a warm-up
// call), with its decoding steps timed where they run. It enters torch.Do itself.
func benchGenerate(m *policy.Model, prompts [][]int, o Options, r *Result) error {
	p := &policy.Policy{ID: "bench", Model: m, Device: m.Device(), MaxBatch: o.GenBatch, StaticBatching: o.StaticGen}
	if o.GenPrompts > 0 {
		prompts = randomPrompts(o.GenPrompts, o.PromptLen, m.Config.VocabSize, o.Seed)
	}
	lengths := o.GenLengths
	if lengths == nil {
		lengths = make([]int, len(prompts))
		for i := range lengths {
			lengths[i] = o.responseLen(i)
		}
	}
	if len(lengths) != len(prompts) {
		return fmt.Errorf("bench: %d response lengths for %d prompts", len(lengths), len(prompts))
	}
	gen := func(n int) (float64, error) {
		settings := make([]llm.Sampling, len(prompts))
		for i := range settings {
			settings[i] = llm.Sampling{Temperature: 1, MaxNewTokens: min(n, lengths[i]), Seed: int64(i)}
		}
		start := time.Now()
		_, err := p.GenerateIDs(context.Background(), prompts, settings)
		return time.Since(start).Seconds(), err
	}
	if _, err := gen(2); err != nil { // warm-up
		return err
	}
	var stop func()
	if o.Profile != nil {
		stop = o.Profile()
	}
	decoding := p.TimeDecoding() // the decoding steps, timed where they run (prefill and packing excluded)
	cpu0 := cpuSeconds()
	total, err := gen(math.MaxInt)
	r.GenCPUSeconds = cpuSeconds() - cpu0
	if stop != nil {
		stop()
	}
	if err != nil {
		return err
	}
	r.GenPrompts, r.GenBatch, r.GenContinuous = len(prompts), o.GenBatch, !o.StaticGen
	var flops float64
	for i, n := range lengths {
		r.GenTokens += n
		P := len(prompts[i])
		flops += forwardFLOPs(m.Config, 1, P, 0, 1)
		for s := 1; s < n; s++ {
			flops += forwardFLOPs(m.Config, 1, 1, P+s-1, 1)
		}
	}
	r.GenSeconds = total
	r.GenTokensPerSec = float64(r.GenTokens) / total
	if steps, elapsed := decoding(); steps > 0 {
		r.DecodeMsPerStep = elapsed.Seconds() * 1000 / float64(steps)
		r.DecodeSteps = steps
	}
	r.GenGFLOPS = flops / total / 1e9
	return nil
}

// randomPrompts returns n prompts of length tokens drawn with seed.
func randomPrompts(n, length, vocab int, seed int64) [][]int {
	rng := rand.New(rand.NewPCG(uint64(seed), 11))
	out := make([][]int, n)
	for i := range out {
		for range length {
			out[i] = append(out[i], rng.IntN(vocab))
		}
	}
	return out
}

// forwardFLOPs estimates the matmul FLOPs of a forward of B rows of T new tokens after past cached
// ones, with lm_head applied to the last headTokens positions of each row.
func forwardFLOPs(c arch.Config, B, T, past, headTokens int) float64 {
	h, q, kv := float64(c.HiddenSize), float64(c.NumAttentionHeads*c.HeadDim), float64(c.NumKeyValueHeads*c.HeadDim)
	perToken := float64(c.NumHiddenLayers) * (h*q + 2*h*kv + q*h + 3*h*float64(c.IntermediateSize))
	S := float64(past + T)
	attn := float64(c.NumHiddenLayers) * 4 * float64(T) * S * q // q·kᵀ and p·v
	head := float64(headTokens) * float64(c.VocabSize) * h
	return 2*float64(B)*(perToken*float64(T)+head) + float64(B)*attn
}

// MatmulGFLOPS times an n×n float32 matmul on dev. Call it on the torch thread.
func MatmulGFLOPS(dev gotch.Device, n int64) float64 {
	s := torch.NewScope()
	defer s.Close()
	a := ts.MustRandn([]int64{n, n}, gotch.Float, dev)
	b := ts.MustRandn([]int64{n, n}, gotch.Float, dev)
	run := func(reps int) float64 {
		start := time.Now()
		for range reps {
			a.MustMatmul(b, false).MustDrop()
		}
		if dev.IsCuda() {
			_ = ts.CudaSynchronize()
		}
		return time.Since(start).Seconds()
	}
	run(1)
	reps := 1
	for {
		sec := run(reps)
		if sec > 0.3 || reps >= 1<<16 {
			return 2 * float64(n*n*n) * float64(reps) / sec / 1e9
		}
		reps = int(math.Ceil(float64(reps) * 0.4 / max(sec, 1e-6)))
	}
}

// cpuSeconds is the process's CPU time so far (user + system).
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// timeTrainSteps is timeSteps for the training step, also recording its CPU time per step in r.
func timeTrainSteps(o Options, r *Result, step func() error) (float64, error) {
	var cpu0 float64
	timed := 0
	sec, err := timeSteps(o, func() error {
		if timed == o.warmups() {
			cpu0 = cpuSeconds()
		}
		timed++
		return step()
	})
	r.TrainCPUMsPerStep = (cpuSeconds() - cpu0) * 1000 / float64(o.Steps)
	return sec, err
}

// warmups is the number of untimed steps: WarmupSteps, 0 = one, < 0 = none.
func (o Options) warmups() int {
	if o.WarmupSteps == 0 {
		return 1
	}
	return max(o.WarmupSteps, 0)
}

// timeSteps runs step o.WarmupSteps times untimed (0 = once, < 0 = never), then o.Steps times, and
// returns the seconds per timed step.
func timeSteps(o Options, step func() error) (float64, error) {
	for range o.warmups() {
		if err := step(); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	for range o.Steps {
		if err := step(); err != nil {
			return 0, err
		}
	}
	return time.Since(start).Seconds() / float64(o.Steps), nil
}
