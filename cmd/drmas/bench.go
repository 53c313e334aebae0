package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"text/tabwriter"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/bench"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// benchFlags are the flags of `drmas bench`.
type benchFlags struct {
	model, preset, config, dtype    string
	memoryCheck                     bool
	cpuprofile                      string
	saveModel, gemm                 string
	batch, promptLen, responseLen   int
	lora, loraRank                  int
	loraTargets                     []string
	steps, threads, blasThreads     int
	interopThreads, warmupSteps     int
	matmulSize                      int64
	seed                            int64
	json, checkpointing, noGenerate bool
	responseLengths                 []int
	microBatch, maxTokens           int
	pack                            bool
	genPrompts, genBatch            int
	genLengths                      string
	continuous                      bool
}

func newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:     "bench (--model DIR | --preset NAME | --config config.json)",
		Short:   "Measure training-step and generation speed of a model on this machine",
		Long:    benchLong,
		Example: benchExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			dev, dt, err := f.parse()
			if err != nil {
				return badInput(err)
			}
			return runBench(cmd, f, dev, dt)
		},
	}
	f.bind(cmd)
	return cmd
}

// benchLong is the help of drmas bench.
const benchLong = `Time a training step and KV-cache generation of a model folder or a random-init preset,
and a 2048² float32 matmul (--matmul-size) on the same device for calibration.

The training step (the one drmas train takes: TrainScore, the pieced backward, with
--checkpointing as models[].gradient_checkpointing) scores --batch sequences of --prompt-len random prompt tokens and
--response-len response tokens (forward with grad, lm_head on the response positions),
takes the token-mean of the response log-probs as the loss, runs backward and an AdamW
update. --response-lengths gives response i the length L[i mod n] instead (long-tailed batches);
--micro-batch M runs the step in micro-batches of M sequences, each padded to its longest, and
--max-tokens-per-micro-batch N packs them by length within N padded tokens instead, as drmas
train does with algorithm.micro_batch_size and max_tokens_per_micro_batch (the loss is the batch's
token-mean either way); the output gives the micro-batches and their padding fraction. Generation samples --response-len tokens (temperature 1, no stop tokens) for
--batch prompts of --prompt-len tokens, with one prefill and one step per token. With
--gen-prompts N --gen-batch R it generates from N prompts with R rows in flight (continuous
batching: a finished row's slot goes to the next prompt at the next step; --continuous=false:
static batches of R rows, each run to its end), and --gen-lengths gives each response its own
length (lognormal:150:1:16:1024: long-tailed, drawn with --seed): a response stops there.

Attention is libtorch's fused scaled_dot_product_attention where the libtorch has it (2.1 and
later) and the call allows it, tiles of query rows otherwise (Debian's 1.13); the output says which
("attention"), and DRMAS_ATTENTION=tiles forces the tiles.

Achieved GFLOP/s are estimates: the matmul FLOPs of the forward (projections, MLP,
lm_head where it is applied, attention's q·kᵀ and p·v), times three for training.
Presets are random models with vocabulary 512: Qwen2's tiny (hidden 256, 4 layers, 4 heads),
small (hidden 512, 8 layers, 8 heads) and long (small with an MLP of 264: 9.8M parameters,
32,768 positions, for long sequences); moe, a Qwen3-MoE of small's shape with 8 experts of 1,024
per layer, 2 per token, and moe-dense, the Qwen3 of the same shape and the same active parameters
(one MLP of 2,048). The output gives the parameters and, for a mixture of experts, the active ones.`

// benchExample is the Example text of drmas bench.
const benchExample = `  drmas bench --preset tiny --batch 16 --prompt-len 64 --response-len 64
  drmas bench --preset small --batch 16 --prompt-len 64 --response-len 64 --steps 2 --json
  drmas bench --preset long --batch 1 --prompt-len 256 --response-len 3840 --steps 2 --no-generate --checkpointing
  drmas bench --preset long --batch 32 --prompt-len 128 --response-lengths 255,42,282,616,1024,31 \
      --max-tokens-per-micro-batch 9216 --no-generate --steps 2
  drmas bench --config configs/models/qwen3-4b/config.json --device cuda --dtype bfloat16 --batch 4 \
      --prompt-len 8192 --response-len 4096 --steps 1 --no-generate --checkpointing --json
  drmas bench --model pkg/policy/testdata/toy --batch 4 --prompt-len 16 --response-len 16 --cpuprofile gen.pprof
  go tool pprof -top gen.pprof   # where generation spends its time
  drmas bench --preset long --batch 1 --prompt-len 128 --response-len 16 --steps 1 --warmup-steps 0 \
      --gen-prompts 64 --gen-batch 16 --gen-lengths lognormal:150:1:16:1024 --continuous=false`

// bind declares the flags of drmas bench on cmd, writing into f.
func (f *benchFlags) bind(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", "", "model folder (config.json and weights; no tokenizer needed)")
	fl.StringVar(&f.preset, "preset", "", "random-init model instead of a folder: tiny, small, long, moe or moe-dense")
	fl.StringVar(&f.config, "config", "", "random-init model of a Hugging Face config.json, built on the device (no weights needed)")
	fl.IntVar(&f.batch, "batch", 16, "sequences per training step and prompts per generation")
	fl.IntVar(&f.lora, "lora", 0, "train this many LoRA adapters on the model, frozen, instead of the model (a step: one step of each); reports peak memory and an adapter folder's size")
	fl.IntVar(&f.loraRank, "lora-rank", 16, "rank of the --lora adapters (alpha 2·rank)")
	fl.StringSliceVar(&f.loraTargets, "lora-targets", []string{arch.LoRAAllLinear}, "modules of the --lora adapters: all-linear (every projection) and/or projections, embed_tokens, lm_head")
	fl.IntVar(&f.promptLen, "prompt-len", 64, "prompt tokens per sequence")
	fl.IntVar(&f.responseLen, "response-len", 64, "response tokens per sequence (scored, and generated)")
	fl.IntSliceVar(&f.responseLengths, "response-lengths", nil, "response lengths L1,L2,…: response i gets L[i mod n] tokens (instead of --response-len)")
	fl.IntVar(&f.microBatch, "micro-batch", 0, "training step in micro-batches of this many sequences, each padded to its longest (0: the whole --batch in one)")
	fl.BoolVar(&f.pack, "pack", false, "with --max-tokens-per-micro-batch: pack the sequences, several to a row under a block-diagonal causal mask, one row of up to that many real tokens a micro-batch, instead of padding sorted rows")
	fl.IntVar(&f.maxTokens, "max-tokens-per-micro-batch", 0, "training step in micro-batches packed by length within this many padded tokens, rows × longest row (algorithm.max_tokens_per_micro_batch; 0: by --micro-batch)")
	fl.IntVar(&f.steps, "steps", 3, "timed training steps (after --warmup-steps untimed ones)")
	fl.IntVar(&f.warmupSteps, "warmup-steps", 1, "untimed training steps before the timed ones (0: none; a step of a long sequence can take minutes)")
	fl.IntVar(&f.threads, "threads", 0, "libtorch intra-op threads (0 = drmas's default, as drmas train uses)")
	fl.IntVar(&f.interopThreads, "interop-threads", 0, "libtorch inter-op threads (0 = drmas's default)")
	fl.IntVar(&f.blasThreads, "blas-threads", 0, "threads of the float32 matrix products, oneDNN's or OpenBLAS's (0 = drmas's default)")
	fl.StringVar(&f.gemm, "gemm", "auto", "library of the float32 CPU matrix products: auto (oneDNN when libtorch has it), onednn or blas (also DRMAS_GEMM)")
	fl.BoolVar(&f.memoryCheck, "memory-check", true, "refuse a benchmark whose memory plan exceeds the device's memory, naming what fits (false: run it anyway)")
	fl.Int64Var(&f.seed, "seed", 1, "seed of the preset's weights and of the random tokens")
	fl.StringVar(&f.dtype, "dtype", "auto", dtypeHelp)
	fl.Int64Var(&f.matmulSize, "matmul-size", 2048, "side of the float32 matmul timed for calibration")
	fl.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile (pprof) of the timed generation to this file")
	fl.StringVar(&f.saveModel, "save-model", "", "with --preset: write the model as a Hugging Face folder here first (for scripts/bench_torch.py)")
	fl.BoolVar(&f.checkpointing, "checkpointing", false, "training steps recompute each decoder layer in backward (models[].gradient_checkpointing)")
	fl.BoolVar(&f.noGenerate, "no-generate", false, "time the training step only (long sequences: generating thousands of tokens takes long)")
	fl.BoolVar(&f.json, "json", false, "print the figures as JSON")
	fl.IntVar(&f.genPrompts, "gen-prompts", 0, "prompts to generate from (0: --batch)")
	fl.IntVar(&f.genBatch, "gen-batch", 0, "most generation rows in flight (0: every prompt at once)")
	fl.BoolVar(&f.continuous, "continuous", true, "continuous batching in generation: a finished row's slot goes to the next prompt at the next step (false: static batches of --gen-batch rows, each run to its end)")
	fl.StringVar(&f.genLengths, "gen-lengths", "", "response length of each generated prompt: N, or lognormal:MEDIAN:SIGMA:MIN:MAX drawn with --seed (default: --response-len); generation stops at it")
}

func (f benchFlags) parse() (gotch.Device, gotch.DType, error) {
	var errs []error
	if n := btoi(f.model != "") + btoi(f.preset != "") + btoi(f.config != ""); n != 1 {
		errs = append(errs, errors.New("give exactly one of --model, --preset and --config"))
	}
	if f.saveModel != "" && f.preset == "" {
		errs = append(errs, errors.New("--save-model needs --preset"))
	}
	if f.lora < 0 || f.lora > 64 || f.loraRank < 1 || f.loraRank > 4096 {
		errs = append(errs, fmt.Errorf("--lora %d, --lora-rank %d: want 0–64 adapters of rank 1–4096", f.lora, f.loraRank))
	}
	if _, err := arch.ExpandTargets(f.loraTargets); err != nil {
		errs = append(errs, fmt.Errorf("--lora-targets: %w", err))
	}
	if f.preset != "" {
		if _, err := bench.Preset(f.preset); err != nil {
			errs = append(errs, fmt.Errorf("--preset: %w", err))
		}
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"--batch", f.batch}, {"--prompt-len", f.promptLen}, {"--response-len", f.responseLen}, {"--steps", f.steps}} {
		if v.n <= 0 {
			errs = append(errs, fmt.Errorf("%s %d: must be > 0", v.name, v.n))
		}
	}
	for _, l := range f.responseLengths {
		if l <= 0 {
			errs = append(errs, fmt.Errorf("--response-lengths %v: every length must be > 0", f.responseLengths))
			break
		}
	}
	if f.microBatch < 0 || f.maxTokens < 0 {
		errs = append(errs, fmt.Errorf("--micro-batch %d, --max-tokens-per-micro-batch %d: must be ≥ 0", f.microBatch, f.maxTokens))
	}
	if f.lora > 0 && (f.microBatch > 0 || f.maxTokens > 0) {
		errs = append(errs, errors.New("--micro-batch and --max-tokens-per-micro-batch cut the full model's training step, not --lora's"))
	}
	if f.pack && f.maxTokens == 0 {
		errs = append(errs, errors.New("--pack needs --max-tokens-per-micro-batch (the tokens of a packed row)"))
	}
	if f.warmupSteps < 0 {
		errs = append(errs, fmt.Errorf("--warmup-steps %d: must be ≥ 0", f.warmupSteps))
	}
	if f.matmulSize <= 0 {
		errs = append(errs, fmt.Errorf("--matmul-size %d: must be > 0", f.matmulSize))
	}
	if f.gemm != "auto" {
		if err := torch.SetGEMM(f.gemm); err != nil {
			errs = append(errs, fmt.Errorf("--gemm: %w", err))
		}
	}
	if f.threads < 0 || f.interopThreads < 0 || f.blasThreads < 0 {
		errs = append(errs, fmt.Errorf("--threads %d, --interop-threads %d, --blas-threads %d: must be ≥ 0", f.threads, f.interopThreads, f.blasThreads))
	}
	dev, dt, err := deviceAndDType(f.dtype)
	if err != nil {
		errs = append(errs, err)
	}
	return dev, dt, errors.Join(errs...)
}

// benchOutput is what --json prints.
type benchOutput struct {
	Model       string `json:"model"`
	ModelType   string `json:"model_type"`
	Hidden      int    `json:"hidden_size"`
	Layers      int    `json:"num_hidden_layers"`
	Batch       int    `json:"batch"`
	PromptLen   int    `json:"prompt_len"`
	ResponseLen int    `json:"response_len"`
	// PlanPeakMB is the memory plan's peak (bench.PlanPeak: the training step's largest micro-batch by
	// drmas train's formulas, or generation's KV cache), to set against train_peak_rss_mb.
	PlanPeakMB float64 `json:"plan_peak_mb"`
	bench.Result
}

func runBench(cmd *cobra.Command, f benchFlags, dev gotch.Device, dt gotch.DType) error {
	m, name, dt, err := loadBenchModel(f, dev, dt)
	if err != nil {
		return badInput(err)
	}
	c := m.Config
	log.Info().Str("model", name).Int64("params", m.NumParams()).Str("device", torch.DeviceString(dev)).
		Str("dtype", policy.DTypeName(dt)).Int("batch", f.batch).Int("prompt_len", f.promptLen).
		Int("response_len", f.responseLen).Msg("benchmarking")
	opts := f.options()
	if err := f.genOptions(&opts); err != nil {
		return badInput(err)
	}
	if f.cpuprofile != "" {
		prof, err := os.Create(f.cpuprofile)
		if err != nil {
			return badInput(fmt.Errorf("--cpuprofile: %w", err))
		}
		defer prof.Close()
		opts.Profile = cpuProfile(prof)
	}
	if f.memoryCheck && f.lora == 0 { // (LoRA trains no base gradients: the full model's plan would overstate it)
		if err := bench.CheckMemory(c, int64(dt.Size()), opts, torch.DeviceString(dev)); err != nil {
			return badInput(err)
		}
	}
	r, err := bench.Run(m, opts)
	if err != nil {
		return err
	}
	planMB := float64(bench.PlanPeak(c, int64(dt.Size()), opts, !dev.IsCuda())) / (1 << 20)
	out := cmd.OutOrStdout()
	if f.json {
		return printJSON(out, benchOutput{Model: name, ModelType: c.ModelType, Hidden: c.HiddenSize, Layers: c.NumHiddenLayers,
			Batch: f.batch, PromptLen: f.promptLen, ResponseLen: f.responseLen, PlanPeakMB: planMB, Result: r})
	}
	return printBench(out, f, name, c, r, planMB)
}

// loadBenchModel sets up libtorch's threads and loads the model the flags name: a preset or a
// config.json at random (saved first with --save-model), or a model folder. It returns the model,
// its name in the output and the dtype "auto" resolved to.
func loadBenchModel(f benchFlags, dev gotch.Device, dt gotch.DType) (*policy.Model, string, gotch.DType, error) {
	name := f.model
	var m *policy.Model
	err := torch.Do(func() error {
		torch.SetupThreads(torch.Threads{IntraOp: f.threads, InterOp: f.interopThreads, BLAS: f.blasThreads})
		if f.preset != "" || f.config != "" {
			var cfg arch.Config
			var err error
			if f.preset != "" {
				name = "preset " + f.preset
				cfg, _ = bench.Preset(f.preset)
			} else if cfg, err = arch.ReadConfig(f.config); err != nil {
				return err
			} else {
				name = "random " + f.config
			}
			if dt, err = autoDType(dt, dev, ""); err != nil {
				return err
			}
			if m, err = policy.NewRandom(cfg, dev, dt, f.seed); err != nil || f.saveModel == "" {
				return err
			}
			return m.Save(f.saveModel)
		}
		var err error
		if dt, err = autoDType(dt, dev, f.model); err != nil {
			return err
		}
		m, err = policy.Load(f.model, dev, dt)
		return err
	})
	return m, name, dt, err
}

// options are the training step's bench options the flags give (generation's come from genOptions).
func (f benchFlags) options() bench.Options {
	opts := bench.Options{Batch: f.batch, PromptLen: f.promptLen, ResponseLen: f.responseLen, Steps: f.steps, Seed: f.seed,
		MatmulSize: f.matmulSize, Checkpointing: f.checkpointing, NoGenerate: f.noGenerate, WarmupSteps: f.warmupSteps,
		LoRAAdapters: f.lora, LoRARank: f.loraRank, LoRATargets: f.loraTargets,
		ResponseLengths: f.responseLengths, MicroBatch: f.microBatch, MaxTokensPerMicroBatch: f.maxTokens, Pack: f.pack}
	if f.warmupSteps == 0 {
		opts.WarmupSteps = -1
	}
	return opts
}

// cpuProfile is a bench.Options.Profile that profiles into prof (an error is logged, not fatal).
func cpuProfile(prof io.Writer) func() func() {
	return func() func() {
		if err := pprof.StartCPUProfile(prof); err != nil {
			log.Error().Err(err).Msg("cpu profile")
			return func() {}
		}
		return pprof.StopCPUProfile
	}
}

// printBench writes the figures as a table.
func printBench(out io.Writer, f benchFlags, name string, c arch.Config, r bench.Result, planMB float64) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	params := fmt.Sprintf("%.2fM params", float64(r.Params)/1e6)
	if r.ActiveParams > 0 && r.ActiveParams != r.Params {
		params += fmt.Sprintf(" (%.2fM active a token)", float64(r.ActiveParams)/1e6)
	}
	fmt.Fprintf(w, "model\t%s: %s, hidden %d, %d layers, %s, %s on %s, %d/%d libtorch intra/inter-op threads, %s matrix products on %d threads, %s malloc, %s attention\n",
		name, c.ModelType, c.HiddenSize, c.NumHiddenLayers, params, r.DType, r.Device, r.Threads, r.InteropThreads, r.GEMM, r.BLASThreads, r.Allocator, r.Attention)
	fmt.Fprintf(w, "matmul\t%d² float32: %.1f GFLOP/s\n", f.matmulSize, r.MatmulGFLOPS)
	shape := fmt.Sprintf("%d×(%d+%d) tokens", f.batch, f.promptLen, f.responseLen)
	if len(f.responseLengths) > 0 {
		shape = fmt.Sprintf("%d×(%d+L[i mod %d]) = %d tokens", f.batch, f.promptLen, len(f.responseLengths), r.TrainRealTokens)
	}
	fmt.Fprintf(w, "train step\t%s: %.0f ms/step, %.0f tokens/s, %.1f GFLOP/s (%.0f%% of matmul)\n",
		shape, r.TrainMsPerStep, r.TrainTokensPerSec, r.TrainGFLOPS, 100*r.TrainGFLOPS/r.MatmulGFLOPS)
	fmt.Fprintf(w, "micro-batches\t%d, %.1f%% of their padded positions padding; %.0f ms of CPU time per step\n", r.MicroBatches, 100*r.TrainPadding, r.TrainCPUMsPerStep)
	if f.lora > 0 {
		fmt.Fprintf(w, "lora\t%d adapters of rank %d on %s of the frozen model, %.2fM params each; a training step is one step of each\n", r.LoRAAdapters, r.LoRARank, strings.Join(f.loraTargets, ", "), float64(r.AdapterParams)/1e6)
		fmt.Fprintf(w, "train memory\t%.0f MB peak resident (the process, up to the end of the training steps)\n", r.TrainPeakRSSMB)
		fmt.Fprintf(w, "sync\t%.1f MB per adapter folder, %.1f MB of model weights\n", float64(r.AdapterFolderBytes)/1e6, float64(r.ModelWeightBytes)/1e6)
	} else {
		fmt.Fprintf(w, "train memory\t%.0f MB peak resident (the process, up to the end of the training steps); the memory plan says %.0f MB\n", r.TrainPeakRSSMB, planMB)
	}
	if f.noGenerate {
		return w.Flush()
	}
	printGeneration(w, f, r)
	return w.Flush()
}

// printGeneration writes the generation line of the table.
func printGeneration(w io.Writer, f benchFlags, r bench.Result) {
	if f.genPrompts == 0 && f.genBatch == 0 && f.genLengths == "" {
		fmt.Fprintf(w, "generation\t%d×%d tokens after %d-token prompts: %.2f s, %.0f tokens/s, %.1f ms/decode step, %.1f GFLOP/s (%.0f%% of matmul)\n",
			f.batch, f.responseLen, f.promptLen, r.GenSeconds, r.GenTokensPerSec, r.DecodeMsPerStep, r.GenGFLOPS, 100*r.GenGFLOPS/r.MatmulGFLOPS)
		return
	}
	mode := "static"
	if r.GenContinuous {
		mode = "continuous"
	}
	fmt.Fprintf(w, "generation\t%d tokens for %d %d-token prompts, %s batching of %s rows: %.2f s, %.0f tokens/s, %.1f ms/decode step, %.1f GFLOP/s (%.0f%% of matmul)\n",
		r.GenTokens, r.GenPrompts, f.promptLen, mode, rowsInFlight(r.GenBatch), r.GenSeconds, r.GenTokensPerSec, r.DecodeMsPerStep, r.GenGFLOPS, 100*r.GenGFLOPS/r.MatmulGFLOPS)
}

func rowsInFlight(n int) string {
	if n <= 0 {
		return "all"
	}
	return fmt.Sprint(n)
}

// genOptions sets the generation part of opts from the flags.
func (f benchFlags) genOptions(opts *bench.Options) error {
	if f.genPrompts < 0 || f.genBatch < 0 {
		return errors.New("--gen-prompts and --gen-batch must be ≥ 0")
	}
	opts.GenPrompts, opts.GenBatch, opts.StaticGen = f.genPrompts, f.genBatch, !f.continuous
	if f.genLengths == "" {
		return nil
	}
	g, err := bench.ParseGenLengths(f.genLengths)
	if err != nil {
		return fmt.Errorf("--gen-lengths: %w", err)
	}
	n := f.genPrompts
	if n == 0 {
		n = f.batch
	}
	opts.GenLengths = g.Draw(n, f.seed)
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
