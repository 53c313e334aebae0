package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/normalize"
)

// estimatorsFlags are the flags of `drmas estimators`.
type estimatorsFlags struct {
	input, base   string
	estimators    []string
	eps, minStd   float64
	populationStd bool
	json          bool
}

func newEstimatorsCmd() *cobra.Command {
	var f estimatorsFlags
	cmd := &cobra.Command{
		Use:     "estimators --input FILE",
		Short:   "Compare advantage estimators on the same rollout: per-agent advantages and energy ΣA²",
		Long:    estimatorsLong,
		Example: estimatorsExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			est, err := f.parse()
			if err != nil {
				return badInput(err)
			}
			return runEstimators(cmd, f, est)
		},
	}
	f.bind(cmd)
	return cmd
}

// estimatorsLong is the help of drmas estimators.
const estimatorsLong = `Read one rollout as JSON lines of samples (a training dump rollouts/step-N.jsonl, an eval
transcript, or any file with uid, traj_uid, agent and score per line) and compute every
estimator's advantages on it. The table has a row per agent and estimator: calls, advantage
mean/std/min/max, the energy ΣA² of the agent's advantages and its ratio to the energy under
the base estimator (Dr. MAS by default). Lemma 4.2 models an agent's squared gradient norm as
proportional to ΣA², so energy/drmas predicts how much larger the agent's squared gradient
norm is under that estimator than under Dr. MAS. The inflation column is the lemma's
(σ_k² + (μ_k − μ)²)/σ², the same for every estimator.

Estimators: grpo (reference-code GRPO, trajectory averages), grpo-call (global baseline
on per-call scores), drmas, at-grpo (agent × turn groups), role-baseline (s − μ_k, SPIRAL
style), and per-agent overrides written preset+agent=preset (drmas+searcher=grpo).
--eps, --min-std and --population-std apply to every estimator.

The input is read as drmas advantages reads it, never held: indexed once (12 bytes per line),
then read back a prompt group at a time for every estimator (stdin is copied to a temporary
file first).`

// estimatorsExample is the Example text of drmas estimators.
const estimatorsExample = `  drmas estimators --input pkg/normalize/testdata/samples.jsonl
  drmas train --config configs/toy-search.yaml --set run.dump_every=50 --set run.steps=50   # writes rollouts/step-50.jsonl
  drmas estimators --input runs/toy-search/rollouts/step-50.jsonl --min-std 0.1
  drmas estimators --input pkg/normalize/testdata/samples.jsonl --estimator grpo-call --estimator drmas+searcher=grpo --json`

// bind declares the flags of drmas estimators on cmd, writing into f.
func (f *estimatorsFlags) bind(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.input, "input", "", "samples file (JSON lines), or - for stdin")
	fl.StringArrayVar(&f.estimators, "estimator", normalize.Presets(), "an estimator to compare (repeat): a preset, or preset+agent=preset+…")
	fl.StringVar(&f.base, "base", "drmas", "the estimator energies are relative to")
	fl.Float64Var(&f.eps, "eps", normalize.DefaultEps, "ε in A = (s − μ)/(σ + ε), for every estimator")
	fl.Float64Var(&f.minStd, "min-std", 0, "floor on σ for every estimator: σ used = max(σ, min-std); 0 = off")
	fl.BoolVar(&f.populationStd, "population-std", false, "use the population std (1/n) instead of the unbiased 1/(n−1)")
	fl.BoolVar(&f.json, "json", false, "write the comparison as JSON")
}

// parse reads the estimators to compare: each --estimator on the Dr. MAS preset with --eps, --min-std
// and --population-std, checked, and --base among them.
func (f estimatorsFlags) parse() ([]normalize.Estimator, error) {
	if f.input == "" {
		return nil, errors.New("--input is required (a samples file, or - for stdin)")
	}
	base := normalize.DrMAS()
	base.Eps, base.MinStd, base.Unbiased = f.eps, f.minStd, !f.populationStd
	var est []normalize.Estimator
	for _, spec := range f.estimators {
		e, err := normalize.ParseEstimator(spec, base)
		if err != nil {
			return nil, fmt.Errorf("--estimator: %w", err)
		}
		if err := e.Options.Validate(); err != nil {
			return nil, fmt.Errorf("--estimator %s: %w", spec, err)
		}
		est = append(est, e)
	}
	if !slices.ContainsFunc(est, func(e normalize.Estimator) bool { return e.Name == f.base }) {
		return nil, fmt.Errorf("--base %q: not one of the estimators compared", f.base)
	}
	return est, nil
}

// runEstimators compares the estimators on the samples file and writes the table (or JSON).
func runEstimators(cmd *cobra.Command, f estimatorsFlags, est []normalize.Estimator) error {
	// Streamed as drmas advantages streams: the file is indexed once, then read back a prompt group
	// at a time for every estimator; the samples are never all held.
	sf, done, err := scanSamples(cmd, f.input)
	if err != nil {
		return badInput(err)
	}
	defer done()
	c, err := normalize.CompareFile(sf, est, f.base)
	if err != nil {
		return fmt.Errorf("compare estimators: %w", err)
	}
	if f.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(c)
	}
	return c.WriteTable(cmd.OutOrStdout())
}
