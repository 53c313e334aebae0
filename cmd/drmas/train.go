package main

import (
	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/config"
)

func init() { register(newTrainCmd) }

type trainFlags struct {
	config string
	sets   []string
	dryRun bool
	resume bool
	force  bool
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train --config FILE",
		Short: "Train a multi-agent team with GRPO / Dr. MAS",
		Long: `Runs the training loop: rollouts of the configured orchestra, advantages (global GRPO,
agent-wise Dr. MAS or an ablation), then clipped policy-gradient updates per model, with per-agent
gradient norms, checkpoints and validation. Metrics go to <run.dir>/metrics.jsonl.`,
		Example: `  drmas train --config configs/toy-math.yaml
  drmas train --config configs/toy-search.yaml --set algorithm.normalization.preset=grpo --set run.dir=runs/grpo
  drmas train --config configs/toy-math.yaml --dry-run      # print the resolved config and exit
  drmas train --config configs/toy-math.yaml --resume       # continue from the latest checkpoint`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig(f.config, f.sets)
			if err != nil {
				return err
			}
			if f.dryRun {
				b, err := cfg.YAML()
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			return runTrain(cmd, cfg, f)
		},
	}
	addConfigFlags(cmd, &f.config, &f.sets)
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "print the resolved config and exit")
	cmd.Flags().BoolVar(&f.resume, "resume", false, "continue the run in run.dir from its latest checkpoint")
	cmd.Flags().BoolVar(&f.force, "force", false, "start over in a run.dir that already holds a run (deletes it)")
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
