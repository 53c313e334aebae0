package main

import (
	"fmt"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/train"
)

func init() { register(newTrainCmd) }

type trainFlags struct {
	config string
	sets   []string
	dryRun bool
	// checkFiles makes --dry-run open the files the config names.
	checkFiles bool
	resume     bool
	force      bool
	nproc      int
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train --config FILE",
		Short: "Train a multi-agent team with GRPO / Dr. MAS",
		Long: `Runs the training loop: rollouts of the configured orchestra, advantages (global GRPO,
agent-wise Dr. MAS or an ablation), then clipped policy-gradient updates per model, with per-agent
gradient norms, checkpoints and validation. Metrics go to <run.dir>/metrics.jsonl.

Data-parallel: --nproc N starts N local ranks; RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in the environment (torchrun, SLURM, PyTorchJob) make this process one rank of a group.`,
		Example: `  drmas train --config configs/toy-math.yaml
  drmas train --config configs/toy-search.yaml --set algorithm.normalization.preset=grpo --set run.dir=runs/grpo
  drmas train --config configs/toy-math.yaml --dry-run      # check everything but the weights, print the resolved config
  drmas train --config configs/toy-math.yaml --resume       # continue from the latest checkpoint
  drmas train --config configs/toy-math.yaml --nproc 2      # data-parallel: 2 local ranks (Gloo on CPU)
  torchrun --nnodes 2 --nproc-per-node 4 ... $(which drmas) train --config run.yaml   # any torchrun-style launcher`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig(f.config, f.sets)
			if err != nil {
				return err
			}
			if f.dryRun {
				return dryRun(cmd, cfg, f.checkFiles)
			}
			return runTrain(cmd, cfg, f)
		},
	}
	addConfigFlags(cmd, &f.config, &f.sets)
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "check everything that needs no weights (model headers, tokenizers, templates, data files' first records, retriever), print the resolved config and exit")
	cmd.Flags().BoolVar(&f.checkFiles, "check-files", true, "with --dry-run: open the model, tokenizer and data files (false: check the config alone, for a config meant for another machine)")
	cmd.Flags().BoolVar(&f.resume, "resume", false, "continue the run in run.dir from its latest checkpoint")
	cmd.Flags().BoolVar(&f.force, "force", false, "start over in a run.dir that already holds a run (deletes it)")
	cmd.Flags().IntVar(&f.nproc, "nproc", 1, "data-parallel workers to start on this machine (each a rank of one c10d group; see README)")
	return cmd
}

// addConfigFlags adds --config and --set.
func addConfigFlags(cmd *cobra.Command, path *string, sets *[]string) {
	cmd.Flags().StringVarP(path, "config", "c", "", "run config (YAML); see configs/reference.yaml")
	cmd.Flags().StringArrayVar(sets, "set", nil, "override a config key: --set run.steps=10 (repeatable; list entries by index: models.0.optim.lr=1e-5)")
	_ = cmd.MarkFlagRequired("config")
}

// loadConfig reads a config; any problem is bad input (exit 2).
func loadConfig(path string, sets []string) (*config.Config, error) {
	cfg, err := config.Load(path, sets)
	return cfg, badInput(err)
}

// dryRun checks the config as far as it can without weights and prints the resolved config.
func dryRun(cmd *cobra.Command, cfg *config.Config, checkFiles bool) error {
	if checkFiles {
		warnings, err := train.Check(cfg)
		for _, w := range warnings {
			log.Warn().Msg(w)
		}
		if err != nil {
			return badInput(fmt.Errorf("%s: %w", cfg.Source, err))
		}
	}
	b, err := cfg.YAML()
	if err != nil {
		return err
	}
	_, err = cmd.OutOrStdout().Write(b)
	return err
}
