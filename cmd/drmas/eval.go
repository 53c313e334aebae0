package main

import (
	"fmt"
	"os"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/team"
	"github.com/drmas/drmas/pkg/train"
)

type evalFlags struct {
	config, checkpoint, out string
	sets, data              []string
	k, limit, batch         int
	temperature, topP       float64
	seed                    int64
	asJSON                  bool
}

func newEvalCmd() *cobra.Command {
	var f evalFlags
	cmd := &cobra.Command{
		Use:   "eval --config FILE [--checkpoint DIR]",
		Short: "Evaluate a multi-agent team: avg@k and pass@k per dataset, per-agent figures, transcripts",
		Long: `Runs the configured team over evaluation sets with k samples per question and prints, per
dataset and on average, avg@k (mean success over the k samples) and pass@k (any success), then per
agent the calls per trajectory, invalid-output rate and mean response length. --out writes every
agent call as a JSON line (dataset, question_id, sample, traj_uid, turn, agent, prompt, response,
valid, reward, success).

The weights come from --checkpoint (a run's step-N folder, or a model folder for a one-model
config), else from the config's model paths (or its random init). The data are --data files, else
the config's data.val (a toy task: its val split). --limit takes the first questions of each set
(0, the default, takes them all; the config's run.val_limit, which bounds validation during
training, does not apply here). --out is written all at once (a hidden temporary file beside it
until the evaluation ends; one a killed eval left behind is removed by the next write to that path).`,
		Example: `  drmas eval --config configs/toy-math.yaml --k 4 --limit 16   # the config's random init, no training needed
  drmas eval --config configs/toy-math.yaml --checkpoint $(ls -dv runs/toy-math/step-*[0-9] | tail -1) --k 4   # the newest checkpoint
  drmas eval --config configs/toy-search.yaml --checkpoint $(ls -dv runs/toy-search/step-*[0-9] | tail -1) --k 8 --limit 32 --out results.jsonl
  drmas eval --config configs/math-qwen.yaml --data data/math/aime24.parquet --k 16 --temperature 0.6 --top-p 0.95 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig(f.config, f.sets)
			if err != nil {
				return err
			}
			if f.k < 1 || f.limit < 0 || f.batch < 1 {
				return badInput(fmt.Errorf("--k and --batch must be ≥ 1 and --limit ≥ 0"))
			}
			f.overrideSampling(cmd, cfg.Agents)
			cfg.Run.ValLimit = 0 // run.val_limit bounds training's validation; here --limit does (0 = all)
			if f.checkpoint != "" {
				if err := rundir.VerifyManifest(f.checkpoint); err != nil {
					return badInput(fmt.Errorf("--checkpoint: %w", err)) // changed bytes would evaluate other weights
				}
			}
			team, err := train.LoadTeam(cfg, global.device, f.checkpoint)
			if err != nil {
				return badInput(err) // the checkpoint, data, model or tokenizer files (exit 2, as in train)
			}
			defer team.Close()
			sets := team.Val
			if len(f.data) > 0 { // read with the team's tools: their definitions are in the prompts measured
				if sets, err = team.EvalSets(f.data); err != nil {
					return badInput(err)
				}
			}
			if len(sets) == 0 {
				return badInput(fmt.Errorf("%s: no evaluation data: set data.val or pass --data", f.config))
			}
			opts := train.EvalOptions{EvalOptions: env.EvalOptions{K: f.k, Seed: f.seed, BatchSize: f.batch}, Limit: f.limit, Out: f.out}
			opts.Progress = progressBar("eval")
			rep, err := team.Evaluate(cmd.Context(), sets, opts)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), rep)
			}
			return rep.WriteTable(cmd.OutOrStdout())
		},
	}
	addConfigFlags(cmd, &f.config, &f.sets)
	fl := cmd.Flags()
	fl.StringVar(&f.checkpoint, "checkpoint", "", "weights: a run's step-N folder, or a model folder (one-model configs)")
	fl.StringArrayVar(&f.data, "data", nil, "evaluation file (JSONL or Parquet; repeatable); default: the config's data.val")
	fl.IntVar(&f.k, "k", 16, "samples per question")
	fl.Float64Var(&f.temperature, "temperature", 1.0, "sampling temperature for every agent (default: each agent's own)")
	fl.Float64Var(&f.topP, "top-p", 1.0, "top-p for every agent (default: each agent's own)")
	fl.IntVar(&f.limit, "limit", 0, "questions per dataset (0 = all)")
	fl.IntVar(&f.batch, "batch", 32, "questions per orchestra run (each runs batch × k episodes)")
	fl.Int64Var(&f.seed, "seed", 1, "sampling seed")
	fl.StringVar(&f.out, "out", "", "write every agent call as a JSON line to this file")
	fl.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	return cmd
}

// overrideSampling applies --temperature and --top-p, when given, to every agent.
func (f evalFlags) overrideSampling(cmd *cobra.Command, agents []team.Agent) {
	for i := range agents {
		s := &agents[i].Sampling
		if cmd.Flags().Changed("temperature") {
			t := f.temperature
			s.Temperature = &t
		}
		if cmd.Flags().Changed("top-p") {
			s.TopP = f.topP
		}
	}
}

// progressBar draws a progress bar on stderr when it is a terminal (nil otherwise).
func progressBar(what string) func(done, total int) {
	if !term.IsTerminal(int(os.Stderr.Fd())) {
		return nil
	}
	bar := progressbar.NewOptions(-1, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
	return func(done, total int) {
		bar.ChangeMax(total)
		_ = bar.Set(done)
		if done == total {
			_ = bar.Finish()
		}
	}
}
