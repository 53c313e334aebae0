package main

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/inspect"
	"github.com/drmas/drmas/pkg/train"
)

// inspectGradsFlags are the flags of `drmas inspect-grads`.
type inspectGradsFlags struct {
	labels []string
	rule   inspect.Options
	plot   string
	logY   bool
	json   bool

	// counterfactual mode
	config, checkpoint string
	sets               []string
	batches            int

	pool   bool     // the arguments are counterfactual reports to pool
	agents []string // pool only these agents' rows
}

func newInspectGradsCmd() *cobra.Command {
	f := inspectGradsFlags{rule: inspect.DefaultOptions()}
	cmd := &cobra.Command{
		Use:     "inspect-grads RUN [RUN ...] | --config FILE [--checkpoint DIR] | --pool REPORT [REPORT ...]",
		Short:   "Report per-agent gradient norms, spikes and skipped steps of training runs, side by side",
		Long:    inspectGradsLong,
		Example: inspectGradsExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if f.config != "" {
				if f.pool {
					return badInput(fmt.Errorf("--pool and --config are different modes: pick one"))
				}
				return badInput(cobra.NoArgs(cmd, args))
			}
			return badInput(cobra.MinimumNArgs(1)(cmd, args))
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.config != "" {
				return runCounterfactual(cmd, f)
			}
			if err := f.validate(args); err != nil {
				return badInput(err)
			}
			if f.pool {
				return runPool(cmd.OutOrStdout(), f, args)
			}
			return runInspectGrads(cmd.OutOrStdout(), f, args)
		},
	}
	f.bind(cmd)
	return cmd
}

// inspectGradsLong is the help of drmas inspect-grads.
const inspectGradsLong = `Read each run's metrics.jsonl (RUN is a run directory, or a metrics file) and report, per
run and per agent and per model, the pre-clip gradient norm's median, p95 and max, the
spikes, the non-finite norms, the optimizer steps skipped for them, the mean Lemma 4.2
inflation factor (σ_k² + (μ_k − μ)²)/σ² and the mean advantage energy ratio
ΣA²_grpo/ΣA²_drmas, with a verdict per agent judged on the energy ratio where the run logs
it. Where the run logs the σ_k diagnostics (adv_std/agent/<a>/*, adv_norm/agent/<a>/abs_max)
they are printed per agent (smallest σ_k, mean median σ_k, mean fraction of groups with
σ_k < 0.01, largest |A|), and the verdict of an agent whose σ_k collapses cites them. With two runs or more a comparison table puts them side by side (GRPO vs Dr. MAS: the
point of the tool).

A spike is a norm above --spike-factor times the median of the previous --window finite
norms (the current one excluded); nothing is flagged before ⌈window/2⌉ of them exist.
An agent's skipped steps are its model's, known when <run>/config.yaml maps agents to models.

A malformed or truncated metrics line is reported with its line number and skipped; when a
step repeats, the last row wins. The tables go to stdout, warnings to stderr.

Counterfactual mode (--config, optionally --checkpoint): collect --batches rollout batches
with the team's weights and compute, on each same batch and without a step, every agent's
gradient norm under global GRPO, agent-wise Dr. MAS and the two ablation combinations; the
table puts the measured ratio |g_grpo|²/|g_drmas|² beside the inflation factor Lemma 4.2
predicts, with their Spearman rank correlation, and ends with a verdict per agent: by how
much GRPO would scale its squared gradient (the median advantage energy ratio
ΣA²_grpo/ΣA²_drmas, the lemma's model of that scale; the noisier measured ratio is printed
beside it) and whether Dr. MAS is expected to matter for it. The thresholds come from the dial
study (docs/dial.md), where the dialled agent's GRPO norms exceeded Dr. MAS's by more than 2
standard errors.

Pooling (--pool): read counterfactual reports written with --json (one label each, --label
or the file's name; files may share a label), print each label and agent's median ratios
and the Spearman correlation of each predictor with the measured ratio over all rows and over
those medians, with a 95% bootstrap interval (--agent keeps one agent's rows), and with --plot
draw measured against predicted.`

// inspectGradsExample is the Example text of drmas inspect-grads.
const inspectGradsExample = `  drmas inspect-grads pkg/inspect/testdata/grpo pkg/inspect/testdata/drmas
  drmas inspect-grads pkg/inspect/testdata/grpo pkg/inspect/testdata/drmas --plot grads.png
  drmas inspect-grads pkg/inspect/testdata/grpo/metrics.jsonl --label GRPO --spike-factor 10 --window 50 --json
  drmas inspect-grads pkg/inspect/testdata/grpo pkg/inspect/testdata/drmas --min-norm 1 --plot grads.svg --log-y
  drmas inspect-grads --config configs/toy-search.yaml --batches 4   # the config's own weights, no training needed
  drmas inspect-grads --config configs/toy-search.yaml --checkpoint $(ls -dv runs/toy-search/step-*[0-9] | tail -1) --batches 4
  drmas inspect-grads --config configs/toy-dial.yaml --set orchestra.dial.p_wrong=0.5 --set orchestra.dial.p_right=0.5 --json > cf-a.json
  drmas inspect-grads --config configs/toy-dial.yaml --set orchestra.dial.p_wrong=0.9 --set orchestra.dial.p_right=0.1 --json > cf-b.json
  drmas inspect-grads --pool cf-a.json cf-b.json --label "gap 0" --label "gap 0.8" --plot ratios.png`

// bind declares the flags of drmas inspect-grads on cmd, writing into f.
func (f *inspectGradsFlags) bind(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVar(&f.labels, "label", nil, "name of a run in the report (repeat, in the order of the runs; default the run directory's name)")
	fl.Float64Var(&f.rule.Factor, "spike-factor", inspect.DefaultSpikeFactor, "a spike is a norm above this times the trailing median")
	fl.IntVar(&f.rule.Window, "window", inspect.DefaultWindow, "the trailing median is over this many previous finite norms")
	fl.Float64Var(&f.rule.MinNorm, "min-norm", 0, "a spike must also exceed this norm (e.g. 1, the clip threshold); 0 = off")
	fl.StringVar(&f.plot, "plot", "", "draw per-agent gradient norm over steps to this file (.png, .svg, .pdf, .jpg, .tiff)")
	fl.BoolVar(&f.logY, "log-y", false, "log y axis on every panel (default: only where norms span more than 2 decades)")
	fl.BoolVar(&f.json, "json", false, "print one JSON document instead of tables")
	fl.StringVarP(&f.config, "config", "c", "", "counterfactual mode: the run config of the team")
	fl.StringArrayVar(&f.sets, "set", nil, "counterfactual mode: override a config key (repeatable)")
	fl.StringVar(&f.checkpoint, "checkpoint", "", "counterfactual mode: weights (a run's step-N folder); default the config's")
	fl.IntVar(&f.batches, "batches", 4, "counterfactual mode: rollout batches to measure")
	fl.BoolVar(&f.pool, "pool", false, "the arguments are counterfactual reports (--config … --json) to pool")
	fl.StringArrayVar(&f.agents, "agent", nil, "with --pool: keep only this agent's rows (repeatable)")
}

// runCounterfactual measures every agent's gradient norm under each normalization on the same batches.
func runCounterfactual(cmd *cobra.Command, f inspectGradsFlags) error {
	if f.batches < 1 {
		return badInput(fmt.Errorf("--batches must be ≥ 1"))
	}
	cfg, err := loadConfig(f.config, f.sets)
	if err != nil {
		return err
	}
	team, err := train.LoadTeam(cfg, global.device, f.checkpoint)
	if err != nil {
		return badInput(err) // the checkpoint, data, model or tokenizer files (exit 2, as in train)
	}
	defer team.Close()
	rep, err := train.Counterfactual(cmd.Context(), team, f.batches)
	if err != nil {
		return err
	}
	if f.json {
		return printJSON(cmd.OutOrStdout(), rep)
	}
	return rep.WriteTable(cmd.OutOrStdout(), train.NormalizationNames())
}

func (f inspectGradsFlags) validate(args []string) error {
	if len(f.labels) > len(args) {
		return fmt.Errorf("%d --label flags for %d runs", len(f.labels), len(args))
	}
	if err := f.rule.Validate(); err != nil {
		return fmt.Errorf("--spike-factor/--window/--min-norm: %w", err)
	}
	if f.plot != "" {
		if _, err := plotFormat(f.plot); err != nil {
			return err
		}
	}
	return nil
}

// plotFormat returns the image format named by the plot file's extension.
func plotFormat(path string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	switch ext {
	case "png", "svg", "pdf", "jpg", "jpeg", "tif", "tiff":
		return ext, nil
	}
	return "", fmt.Errorf("--plot %s: want a .png, .svg, .pdf, .jpg or .tiff file", path)
}

func runInspectGrads(stdout io.Writer, f inspectGradsFlags, args []string) error {
	runs := make([]*inspect.Run, len(args))
	warns := make([][]inspect.Warning, len(args))
	for i, path := range args {
		run, w, err := inspect.ReadMetrics(path)
		if err != nil {
			return badInput(err)
		}
		if i < len(f.labels) && f.labels[i] != "" {
			run.Label = f.labels[i]
		}
		logWarnings(run.Label, w)
		runs[i], warns[i] = run, w
	}
	rep, err := inspect.Summarize(runs, warns, f.rule)
	if err != nil {
		return badInput(err)
	}
	if f.plot != "" {
		format, _ := plotFormat(f.plot)
		err := atomicfile.Write(f.plot, func(w io.Writer) error {
			return inspect.Plot(w, rep, runs, inspect.PlotOptions{Format: format, LogY: f.logY})
		})
		if err != nil {
			return err
		}
		log.Info().Str("file", f.plot).Msg("plot written")
	}
	if f.json {
		return rep.WriteJSON(stdout)
	}
	return rep.WriteText(stdout)
}

// runPool pools counterfactual reports: medians per label and agent, the predictors' correlations.
func runPool(stdout io.Writer, f inspectGradsFlags, args []string) error {
	labels := make([]string, len(args))
	reps := make([]*inspect.CounterfactualReport, len(args))
	for i, path := range args {
		labels[i] = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		if i < len(f.labels) && f.labels[i] != "" {
			labels[i] = f.labels[i]
		}
		rep, err := inspect.ReadCounterfactual(path)
		if err != nil {
			return badInput(err)
		}
		if len(f.agents) > 0 {
			rep.Rows = slices.DeleteFunc(rep.Rows, func(r inspect.CounterfactualRow) bool { return !slices.Contains(f.agents, r.Agent) })
		}
		reps[i] = rep
	}
	pooled := inspect.Pool(labels, reps)
	if f.plot != "" {
		format, _ := plotFormat(f.plot)
		err := atomicfile.Write(f.plot, func(w io.Writer) error {
			return inspect.PlotPooled(w, pooled, inspect.PlotOptions{Format: format})
		})
		if err != nil {
			return err
		}
		log.Info().Str("file", f.plot).Msg("plot written")
	}
	if f.json {
		return printJSON(stdout, pooled)
	}
	return pooled.WriteTable(stdout)
}

// maxLoggedWarnings bounds the warnings logged per run (a binary file would give one per line); --json
// carries them all.
const maxLoggedWarnings = 20

func logWarnings(label string, warns []inspect.Warning) {
	for i, w := range warns {
		if i == maxLoggedWarnings {
			log.Warn().Str("run", label).Msgf("%d more warnings (--json lists them all)", len(warns)-i)
			return
		}
		log.Warn().Str("run", label).Msg(w.String())
	}
}
