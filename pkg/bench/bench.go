package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"syscall"
	"time"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// Presets are the names Preset knows.
var Presets = []string{"tiny", "small", "long", "moe", "moe-dense"}

// Preset returns the configuration of a named random-init model for benchmarks and toy runs:
// "tiny" (hidden 256, 4 layers, 4 heads) or "small" (hidden 512, 8 layers, 8 heads), Qwen2 models
// with vocabulary 512, two query heads per key/value head, an MLP four times as wide and tied
// embeddings; "long" is small with an MLP of 264 (9.8M parameters, attention a large share of a
// long sequence's work) and 32,768 positions, for long-sequence benchmarks. "moe" is a Qwen3-MoE of
// small's shape whose every MLP is 8 experts of 1,024, two per token (Qwen3-30B-A3B's ratio of 128
// experts, 8 per token, in miniature), and "moe-dense" the dense Qwen3 of the same shape with one MLP
// of 2,048: the same active parameters a token (but the router's 4,096 a layer), a quarter of the
// MLP weights.
func Preset(name string) (arch.Config, error) {
	c := arch.Config{ModelType: arch.Qwen2, VocabSize: 512, TieWordEmbeddings: true, MaxPositionEmbeddings: 4096,
		RopeTheta: 1e6, TorchDType: "float32"}
	switch name {
	case "tiny":
		c.HiddenSize, c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads = 256, 4, 4, 2
	case "small", "long", "moe", "moe-dense":
		c.HiddenSize, c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads = 512, 8, 8, 4
	default:
		return arch.Config{}, fmt.Errorf("preset %q: want one of %s", name, strings.Join(Presets, ", "))
	}
	c.IntermediateSize = 4 * c.HiddenSize
	switch name {
	case "long":
		c.IntermediateSize, c.MaxPositionEmbeddings = 264, 32768
	case "moe-dense":
		c.ModelType = arch.Qwen3
	case "moe":
		c.ModelType = "qwen3_moe"
		for k, v := range map[string]any{"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1024, "norm_topk_prob": true} {
			c.SetRaw(k, v)
		}
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
	ActiveParams   int64   `json:"active_params"` // a token's (a mixture of experts: its top-k experts and the router, not all experts)
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
	if n, err := arch.ActiveParamCount(m.Config); err == nil {
		r.ActiveParams = n
	}
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 7))
	seqs, prompts := randomSequences(rng, o.Batch, o.PromptLen, o.responseLen, m.Config.VocabSize)
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

// randomSequences draws n sequences of promptLen prompt tokens and respLen(i) response tokens from
// rng (each sequence's prompt, then its response), and returns them with their prompts.
func randomSequences(rng *rand.Rand, n, promptLen int, respLen func(i int) int, vocab int) ([]policy.Sequence, [][]int) {
	seqs := make([]policy.Sequence, n)
	prompts := make([][]int, n)
	for i := range seqs {
		for range promptLen {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(vocab))
		}
		for range respLen(i) {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(vocab))
		}
		prompts[i] = seqs[i].PromptIDs
	}
	return seqs, prompts
}

// forwardFLOPs estimates the matmul FLOPs of a forward of B rows of T new tokens after past cached
// ones, with lm_head applied to the last headTokens positions of each row.
func forwardFLOPs(c arch.Config, B, T, past, headTokens int) float64 {
	h, q := float64(c.HiddenSize), float64(c.NumAttentionHeads*c.HeadDim)
	perToken := float64(arch.MatmulParams(c)) // a mixture of experts: the router and the experts a token runs through
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
