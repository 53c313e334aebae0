package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/bench"
	"github.com/drmas/drmas/pkg/plan"
	"github.com/drmas/drmas/pkg/policy"
)

// roundTripFlags are the flags of `drmas roundtrip`.
type roundTripFlags struct {
	config, out, dtype, maxShard  string
	batch, promptLen, responseLen int
	seed                          int64
	train, json                   bool
}

func newRoundTripCmd() *cobra.Command {
	var f roundTripFlags
	cmd := &cobra.Command{
		Use:   "roundtrip --config config.json --out DIR",
		Short: "Check a real-size model end to end: random init, sharded save, bit-exact load, generation, a training step",
		Long: `Build a model from a Hugging Face config.json with random weights (on the CPU), save it
to --out as safetensors (sharded with model.safetensors.index.json past --max-shard-size),
free it, load the folder back and check every tensor is byte-identical (SHA-256 per
tensor, so two copies never sit in memory), generate --response-len tokens for --batch
random prompts, and with --train take an AdamW training step (after a warm-up step).
Prints the time and the peak resident memory of each phase, and tokens/s.

configs/models holds Qwen3-0.6B's and Llama-3.2-1B's config.json as published. The
folder it writes loads in transformers and vLLM (with a tokenizer added). --out must be
a new or empty folder.`,
		Example: `  drmas roundtrip --config configs/models/qwen3-0.6b.json --out /tmp/q06 --max-shard-size 1GB --train
  drmas roundtrip --config configs/models/llama-3.2-1b.json --out /tmp/l1b --dtype bfloat16 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, dt, maxShard, err := f.parse()
			if err != nil {
				return badInput(err)
			}
			r, err := bench.RoundTrip(cfg, bench.RoundTripOptions{Dir: f.out, DType: dt, MaxShardBytes: maxShard,
				Seed: f.seed, Batch: f.batch, PromptLen: f.promptLen, ResponseLen: f.responseLen, Train: f.train})
			if err != nil {
				return err
			}
			if !r.BitExact {
				return fmt.Errorf("roundtrip: the loaded weights differ from the saved ones")
			}
			return printRoundTrip(cmd, f, r)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "a Hugging Face config.json (e.g. configs/models/qwen3-0.6b.json)")
	fl.StringVar(&f.out, "out", "", "folder to write the checkpoint to (new or empty)")
	fl.StringVar(&f.dtype, "dtype", "float32", "weights dtype: float32, bfloat16, float16")
	fl.StringVar(&f.maxShard, "max-shard-size", "5GB", "largest safetensors file before sharding (e.g. 500MB, 2GB)")
	fl.IntVar(&f.batch, "batch", 1, "prompts per generation and sequences per training step")
	fl.IntVar(&f.promptLen, "prompt-len", 32, "prompt tokens per sequence")
	fl.IntVar(&f.responseLen, "response-len", 32, "tokens generated (and scored by the training step)")
	fl.Int64Var(&f.seed, "seed", 1, "seed of the weights and the random prompts")
	fl.BoolVar(&f.train, "train", false, "also take an AdamW training step (float32 AdamW needs ~4× the weights' memory)")
	fl.BoolVar(&f.json, "json", false, "print the figures as JSON")
	return cmd
}

func (f roundTripFlags) parse() (arch.Config, gotch.DType, int64, error) {
	var errs []error
	var cfg arch.Config
	if f.config == "" {
		errs = append(errs, errors.New("--config is required"))
	} else if c, err := arch.ReadConfig(f.config); err != nil {
		errs = append(errs, err)
	} else {
		cfg = c
	}
	if f.out == "" {
		errs = append(errs, errors.New("--out is required"))
	} else if entries, err := os.ReadDir(f.out); err == nil && len(entries) > 0 {
		errs = append(errs, fmt.Errorf("--out %s: not empty (roundtrip writes only into a new or empty folder)", f.out))
	}
	dt, err := policy.ParseDType(f.dtype)
	if err != nil {
		errs = append(errs, fmt.Errorf("--dtype: %w", err))
	} else if cfg.ModelType != "" {
		if err := policy.CheckMemory(cfg, gotch.CPU, dt); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.config, err))
		}
	}
	maxShard, err := plan.ParseBytes(f.maxShard) // positive, finite and within int64: NaNGB, 1e30GB are refused
	if err != nil {
		errs = append(errs, fmt.Errorf("--max-shard-size: %w", err))
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"--batch", f.batch}, {"--prompt-len", f.promptLen}, {"--response-len", f.responseLen}} {
		if v.n <= 0 {
			errs = append(errs, fmt.Errorf("%s %d: must be > 0", v.name, v.n))
		}
	}
	return cfg, dt, maxShard, errors.Join(errs...)
}

func printRoundTrip(cmd *cobra.Command, f roundTripFlags, r bench.RoundTripResult) error {
	out := cmd.OutOrStdout()
	if f.json {
		return json.NewEncoder(out).Encode(r)
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "model\t%s: %d params, %s, %.0f MiB in %d safetensors file(s)\n", f.config, r.Params, r.DType, r.ModelMB, r.Shards)
	fmt.Fprintf(w, "init\t%.1f s, peak RSS %.0f MiB\n", r.InitSeconds, r.InitPeakMB)
	fmt.Fprintf(w, "save\t%.1f s, peak RSS %.0f MiB\n", r.SaveSeconds, r.SavePeakMB)
	fmt.Fprintf(w, "load\t%.1f s, peak RSS %.0f MiB, bit-exact %v\n", r.LoadSeconds, r.LoadPeakMB, r.BitExact)
	fmt.Fprintf(w, "generate\t%.1f tokens/s (batch %d), %.0f ms per decoding step, peak RSS %.0f MiB\n",
		r.GenTokensPerSec, f.batch, r.DecodeMsPerStep, r.GenPeakMB)
	if f.train {
		fmt.Fprintf(w, "train\t%.0f ms per step, %.1f tokens/s, peak RSS %.0f MiB, weights moved %v\n",
			r.TrainMsPerStep, r.TrainTokPerSec, r.TrainPeakMB, r.TrainChanged)
	}
	return w.Flush()
}
