package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/drmas/drmas/pkg/check"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/plan"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/drmas/drmas/pkg/train"
)

type trainFlags struct {
	config string
	sets   []string
	dryRun bool
	// checkFiles makes --dry-run open the files the config names.
	checkFiles bool
	resume     bool
	force      bool
	nproc      int
	// json makes --dry-run print {"config": …, "memory": …} as JSON.
	json bool
	// deviceMemory states device capacities for the memory plan (--device-memory).
	deviceMemory []string
	// memoryCheck refuses a run whose memory plan exceeds a device (false: a warning).
	memoryCheck bool
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train --config FILE",
		Short: "Train a multi-agent team with GRPO / Dr. MAS",
		Long: `Runs the training loop: rollouts of the configured orchestra, advantages (global GRPO,
agent-wise Dr. MAS or an ablation), then clipped policy-gradient updates per model, with per-agent
gradient norms, checkpoints and validation. Metrics go to <run.dir>/metrics.jsonl.

Before anything is loaded, a memory plan (docs/memory-plan.md) works out what each device will
hold: weights, master weights, gradients, optimizer state, the activations of one micro-batch at the
longest prompt + response the config allows, the logits chunk and the rollout KV cache. A run whose
plan exceeds a device's memory stops there (exit 2), naming the keys that would make it fit;
--dry-run prints the plan. Device memory: the CPU's MemAvailable, a GPU's total memory (nvidia-smi),
or --device-memory (a plan for another machine, or a machine drmas cannot ask).

Data-parallel: --nproc N starts N local ranks; RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in the environment (torchrun, SLURM, PyTorchJob) make this process one rank of a group.`,
		Example: `  drmas train --config configs/toy-math.yaml
  drmas train --config configs/toy-search.yaml --set algorithm.normalization.preset=grpo --set run.dir=runs/grpo
  drmas train --config configs/toy-math.yaml --dry-run      # check everything but the weights, print the resolved config
  drmas train --config configs/math-qwen.yaml --dry-run --check-files=false --device-memory 80GB \
      --set models.0.path=configs/models/qwen3-4b --set models.1.path=configs/models/qwen3-4b   # the paper's setting on 80 GB GPUs
  drmas train --config configs/toy-math.yaml --dry-run --json   # the resolved config and the memory plan as JSON
  drmas train --config configs/toy-math.yaml --resume       # continue from the latest checkpoint
  drmas train --config configs/toy-math.yaml --nproc 2      # data-parallel: 2 local ranks (Gloo on CPU)
  torchrun --nnodes 2 --nproc-per-node 4 ... $(which drmas) train --config run.yaml   # any torchrun-style launcher`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig(f.config, f.sets)
			if err != nil {
				return err
			}
			if f.json && !f.dryRun {
				return badInput(fmt.Errorf("--json goes with --dry-run (a run's results are in run.dir/metrics.jsonl)"))
			}
			mem, err := plan.ParseMemory(f.deviceMemory)
			if err != nil {
				return badInput(err)
			}
			if f.dryRun {
				return dryRun(cmd, cfg, f, mem)
			}
			if err := checkMemory(cmd.ErrOrStderr(), cfg, f, mem); err != nil {
				return err
			}
			return runTrain(cmd, cfg, f)
		},
	}
	addConfigFlags(cmd, &f.config, &f.sets)
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "check everything that needs no weights (model headers, tokenizers, templates, data files' first records, retriever), print the resolved config and exit")
	cmd.Flags().BoolVar(&f.checkFiles, "check-files", true, "with --dry-run: open the model, tokenizer and data files (false: check the config alone, for a config meant for another machine)")
	cmd.Flags().BoolVar(&f.resume, "resume", false, "continue the run in run.dir from its latest checkpoint")
	cmd.Flags().BoolVar(&f.force, "force", false, "start over in a run.dir that already holds a run (deletes it)")
	cmd.Flags().IntVar(&f.nproc, "nproc", 1, "data-parallel workers to start on this machine (each a rank of one c10d group; see docs/scale-out.md)")
	cmd.Flags().BoolVar(&f.json, "json", false, "with --dry-run: print the resolved config and the memory plan as one JSON document")
	cmd.Flags().StringArrayVar(&f.deviceMemory, "device-memory", nil, "memory the plan checks against instead of asking the machine: 80GB (every device) or cuda:1=40GB (one device); repeatable")
	cmd.Flags().BoolVar(&f.memoryCheck, "memory-check", true, "refuse a run whose memory plan exceeds a device (false: warn and run)")
	return cmd
}

// addConfigFlags adds --config and --set.
func addConfigFlags(cmd *cobra.Command, path *string, sets *[]string) {
	cmd.Flags().StringVarP(path, "config", "c", "", "run config (YAML, required); see configs/reference.yaml")
	cmd.Flags().StringArrayVar(sets, "set", nil, "override a config key: --set run.steps=10 (repeatable; list entries by index: models.0.optim.lr=1e-5)")
}

// loadConfig reads a config; any problem, a missing --config too, is bad input (exit 2).
func loadConfig(path string, sets []string) (*config.Config, error) {
	if path == "" {
		return nil, badInput(errors.New(`required flag "config" not set: --config FILE (a YAML run config; configs/ has examples)`))
	}
	cfg, err := config.Load(path, sets)
	return cfg, badInput(err)
}

// dryRun checks the config as far as it can without weights and prints the resolved config and the
// memory plan (as YAML with the plan in comments, or as one JSON document with --json). A plan that
// does not fit is an error once printed; a plan that cannot be made (a model folder this machine
// lacks, with --check-files=false) is a warning.
func dryRun(cmd *cobra.Command, cfg *config.Config, f trainFlags, mem map[string]int64) error {
	if f.checkFiles {
		warnings, err := check.Check(cfg)
		for _, w := range warnings {
			log.Warn().Msg(w)
		}
		if err != nil {
			return badInput(fmt.Errorf("%s: %w", cfg.Source, err))
		}
	}
	opt := planOptions(f, mem)
	prompts, err := check.MeasurePrompts(cfg)
	switch {
	case err != nil && f.checkFiles:
		return badInput(fmt.Errorf("%s: measuring the data's prompts: %w", cfg.Source, err))
	case err != nil:
		log.Warn().Err(err).Msg("data's prompts not measured (--check-files=false): the plan bounds them by the context")
	}
	opt.Prompts = prompts
	pl, err := plan.Build(cfg, opt)
	if err != nil && (f.checkFiles || !errors.Is(err, fs.ErrNotExist)) {
		// Without files only a model folder that is not on this machine excuses a missing plan; a
		// plan refused for its size is refused (before: a 1.6 EB micro-batch passed as a warning).
		return badInput(fmt.Errorf("%s: memory plan: %w", cfg.Source, err))
	}
	var fit error
	if err != nil {
		log.Warn().Err(err).Msg("memory plan: not made (" + planHint(cfg.Models) + ")")
		pl = nil
	} else {
		pl.Capacities(opt)
		var warnings []string
		warnings, fit = pl.Check()
		for _, w := range warnings {
			log.Warn().Msg(w)
		}
	}
	out := cmd.OutOrStdout()
	if f.json {
		var doc struct {
			Config any        `json:"config"`
			Memory *plan.Plan `json:"memory"`
		}
		b, err := cfg.YAML()
		if err != nil {
			return err
		}
		if err := yaml.Unmarshal(b, &doc.Config); err != nil {
			return err
		}
		doc.Memory = pl
		if err := printJSON(out, doc); err != nil {
			return err
		}
	} else {
		b, err := cfg.YAML()
		if err != nil {
			return err
		}
		if _, err := out.Write(b); err != nil {
			return err
		}
		if pl != nil {
			if err := pl.Write(out); err != nil {
				return err
			}
		}
	}
	if fit != nil {
		return badInput(fmt.Errorf("%s: %w", cfg.Source, fit))
	}
	return nil
}

// checkMemory makes the memory plan of a run about to start and refuses it (exit 2) when it
// exceeds a device, before anything is loaded. A rank that drmas train --nproc started leaves the
// check to the launcher, which planned all its ranks.
func checkMemory(stderr io.Writer, cfg *config.Config, f trainFlags, mem map[string]int64) error {
	if os.Getenv(launchedVar) != "" {
		return nil
	}
	opt := planOptions(f, mem)
	var err error
	if _, distributed, err := dist.EnvFromOS(); err == nil && distributed {
		opt.Device = train.RankDevice(opt.Device, envInt("LOCAL_RANK"))
		opt.HostRanks = envInt("LOCAL_WORLD_SIZE")
	}
	if opt.Prompts, err = check.MeasurePrompts(cfg); err != nil {
		return badInput(fmt.Errorf("%s: measuring the data's prompts: %w", cfg.Source, err))
	}
	pl, err := plan.Build(cfg, opt)
	if err != nil {
		return badInput(fmt.Errorf("%s: memory plan: %w", cfg.Source, err))
	}
	pl.Capacities(opt)
	warnings, err := pl.Check()
	for _, w := range warnings {
		log.Warn().Msg(w)
	}
	for _, d := range pl.Devices {
		log.Info().Str("device", d.Device).Int64("peak_bytes", d.PeakBytes).Int64("capacity_bytes", d.CapacityBytes).
			Str("capacity", d.CapacitySource).Msg("memory plan")
	}
	if err != nil && !f.memoryCheck {
		log.Warn().Err(err).Msg("memory plan does not fit; running anyway (--memory-check=false)")
		return nil
	}
	if err != nil { // the refusal comes with the plan it refuses and the prompt lengths it assumed
		_ = pl.Write(stderr)
	}
	return badInput(err)
}

// planOptions are the memory plan's inputs from the command line: the world size is --nproc, or
// WORLD_SIZE under a torchrun-style launcher (each rank's share of a sharded training state).
func planOptions(f trainFlags, mem map[string]int64) plan.Options {
	world := f.nproc
	if n := envInt("WORLD_SIZE"); n > 1 {
		world = n
	}
	return plan.Options{Device: global.device, CUDA: torch.CUDAAvailable, Memory: mem, HostRanks: f.nproc, WorldSize: world}
}

// envInt reads a whole-number environment variable (0 when unset or not a number).
func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

// planHint says how to plan a config whose model folders are not on this machine: configs/models
// holds the config.json of known models; a model whose path names one of them gets its --set.
func planHint(models []model.Config) string {
	const dir = "configs/models"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "point models[].path at folders holding config.json"
	}
	var sets, known []string
	for _, e := range entries {
		if e.IsDir() { // a model folder (the .json files are config.json files for drmas bench)
			known = append(known, e.Name())
		}
	}
	for i, m := range models {
		base := strings.ToLower(filepath.Base(m.Path))
		for _, k := range known {
			if m.Path != "" && strings.Contains(base, k) {
				sets = append(sets, fmt.Sprintf("--set models.%d.path=%s/%s", i, dir, k))
				break
			}
		}
	}
	if len(sets) == 0 {
		return fmt.Sprintf("%s holds config.json of known models (%s): --set models.N.path=%s/NAME", dir, strings.Join(known, ", "), dir)
	}
	return dir + " holds the config.json of this config's models: " + strings.Join(sets, " ")
}
