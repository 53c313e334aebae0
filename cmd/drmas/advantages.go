package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/drmas/drmas/pkg/files"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/normalize"
)

// advantagesFlags are the flags of `drmas advantages`.
type advantagesFlags struct {
	input, output, statsJSON     string
	preset, mean, std, weighting string
	group, global                string
	agents                       []string
	eps, minStd                  float64
	populationStd                bool
}

func newAdvantagesCmd() *cobra.Command {
	var f advantagesFlags
	cmd := &cobra.Command{
		Use:   "advantages --input FILE",
		Short: "Compute GRPO or Dr. MAS advantages for agent-call samples from any framework",
		Long: `Read samples as JSON lines, one per agent call, with the fields uid (prompt group),
traj_uid (trajectory), agent and score (outcome reward minus that call's invalid-action
penalty); write the same lines with "advantage" added (other fields are kept as they are).
The per-agent statistics and the Lemma 4.2 inflation factors go to stderr, or with
--stats-json to a file, together with the statistics of every group.

The default is Dr. MAS: A = (s − μ_k)/(σ_k + ε) per (uid, agent). --preset grpo gives global
GRPO on trajectory averages (the reference code), grpo-call a global baseline on per-call
scores, at-grpo agent × turn groups (AT-GRPO), role-baseline A = s − μ_k (SPIRAL style);
--mean, --std, --weighting, --group and --global choose any of the paper's ablation
combinations (see pkg/normalize/estimators.go for every formula), and --agent puts one
agent on an estimator of its own. To compare estimators side by side, see drmas estimators.

All input is read and checked before anything is written; a bad line is an error naming its
line, and a failed run leaves no output file behind. The input is read three times (check,
advantages group by group, output) and never held: memory is 12 bytes per line plus the largest
prompt group (stdin is copied to a temporary file first).`,
		Example: `  drmas advantages --input pkg/normalize/testdata/samples.jsonl
  drmas advantages --input pkg/normalize/testdata/samples.jsonl --preset grpo --output grpo.jsonl --stats-json grpo-stats.json
  drmas advantages --input pkg/normalize/testdata/samples.jsonl --mean agent --std global --weighting trajectory --population-std
  drmas advantages --input pkg/normalize/testdata/samples.jsonl --min-std 0.05 --output drmas.jsonl
  drmas advantages --input pkg/normalize/testdata/samples.jsonl --preset at-grpo
  drmas advantages --input pkg/normalize/testdata/samples.jsonl --agent searcher=grpo`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opt, err := f.options()
			if err != nil {
				return badInput(err)
			}
			return runAdvantages(cmd, f, opt)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.input, "input", "", "samples file (JSON lines), or - for stdin")
	fl.StringVar(&f.output, "output", "", "where to write the lines with advantages (default stdout)")
	fl.StringVar(&f.statsJSON, "stats-json", "", "write the statistics as JSON to this file instead of a table on stderr")
	fl.StringVar(&f.preset, "preset", "drmas", "normalization preset: "+strings.Join(normalize.Presets(), "|")+"; the other normalization flags override it")
	fl.StringVar(&f.mean, "mean", "", "where μ comes from: global|agent (default from --preset)")
	fl.StringVar(&f.std, "std", "", "where σ comes from: global|agent|none (none = Dr. GRPO, A = s − μ; default from --preset)")
	fl.StringVar(&f.weighting, "weighting", "", "how an agent's calls count in μ_k, σ_k: step|trajectory (default from --preset)")
	fl.StringVar(&f.group, "group", "", "what μ_k, σ_k are taken over: agent|agent-turn (default from --preset)")
	fl.StringVar(&f.global, "global", "", "what μ, σ are taken over: trajectory (averages)|call (default from --preset)")
	fl.StringArrayVar(&f.agents, "agent", nil, "agent=preset: that agent on an estimator of its own (repeat); it takes --eps, --min-std and --population-std")
	fl.Float64Var(&f.eps, "eps", normalize.DefaultEps, "ε in A = (s − μ)/(σ + ε)")
	fl.BoolVar(&f.populationStd, "population-std", false, "use the population std (1/n, as the paper writes) instead of the unbiased 1/(n−1)")
	fl.Float64Var(&f.minStd, "min-std", 0, "floor on σ: σ used = max(σ, min-std); 0 = off (the paper)")
	return cmd
}

// options builds the estimator options: the flags are a normalize.Spec (the preset, then every
// flag that was set; the flags' defaults are the presets' ε, std estimator and min_std).
func (f advantagesFlags) options() (normalize.Options, error) {
	agents, err := normalize.ParseAgentSpecs(f.agents)
	if err != nil {
		return normalize.Options{}, fmt.Errorf("--agent %w", err)
	}
	spec := normalize.Spec{Preset: f.preset, Mean: f.mean, Std: f.std, Weighting: f.weighting, Group: f.group,
		Global: f.global, Eps: f.eps, PopulationStd: f.populationStd, MinStd: f.minStd, Agents: agents}
	opt, err := spec.Options()
	if err != nil {
		return opt, fmt.Errorf("normalization options: %w", err)
	}
	return opt, nil
}

func runAdvantages(cmd *cobra.Command, f advantagesFlags, opt normalize.Options) error {
	if f.input == "" {
		return badInput(errors.New("--input is required (a samples file, or - for stdin)"))
	}
	sf, done, err := scanSamples(cmd, f.input)
	if err != nil {
		return badInput(err)
	}
	defer done()
	if sf.Len() == 0 {
		return badInput(fmt.Errorf("%s: no samples (an empty input is a mistake upstream, not zero advantages)", f.input))
	}

	// Everything is checked: now compute group by group and write, files through a temporary and a
	// rename.
	var st normalize.Stats
	write := func(w io.Writer) (err error) {
		st, err = sf.Advantages(w, opt, f.statsJSON != "") // the table needs no per-group figures
		return err
	}
	if f.output == "" || f.output == "-" {
		err = write(cmd.OutOrStdout())
	} else {
		err = atomicfile.Write(f.output, write)
	}
	if err != nil {
		return fmt.Errorf("compute advantages: %w", err)
	}
	log.Info().Int("samples", st.Samples).Int("groups", st.Groups).Int("trajectories", st.Trajectories).
		Float64("frac_zero_std", st.FracZeroStd).Int("min_std_applied", st.MinStdApplied).
		Str("options", opt.String()).Msg("advantages computed")
	if f.statsJSON != "" {
		if err := atomicfile.Write(f.statsJSON, func(w io.Writer) error { return normalize.WriteStatsJSON(w, st) }); err != nil {
			return err
		}
		log.Info().Str("file", f.statsJSON).Msg("statistics written")
		return nil
	}
	return st.WriteTable(cmd.ErrOrStderr())
}

// scanSamples opens a samples file (or copies stdin, "-", to a temporary one) and indexes it once, so
// that it can be read back a prompt group at a time: the samples are never all held. done closes
// (and removes) the file; it is nil when err is not.
func scanSamples(cmd *cobra.Command, path string) (sf *normalize.SamplesFile, done func(), err error) {
	in, name, done, err := openSamples(cmd, path)
	if err != nil {
		return nil, nil, err
	}
	size, err := in.Seek(0, io.SeekEnd)
	if err == nil {
		sf, err = normalize.ScanSamples(in, size, name)
	} else {
		err = fmt.Errorf("%s: %w", name, err)
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	return sf, done, nil
}

// openSamples opens the samples file at path, or for "-" a copy of stdin in a temporary file (the
// samples are read more than once, never held in memory); done closes it and removes the copy.
func openSamples(cmd *cobra.Command, path string) (f *os.File, name string, done func(), err error) {
	if path != "-" {
		file, err := files.Open(path, 0)
		if err != nil {
			return nil, "", nil, fmt.Errorf("open input: %w", err)
		}
		return file, path, func() { file.Close() }, nil
	}
	tmp, err := os.CreateTemp("", "drmas-advantages-stdin-*.jsonl")
	if err != nil {
		return nil, "", nil, fmt.Errorf("copy stdin: %w", err)
	}
	done = func() { tmp.Close(); os.Remove(tmp.Name()) }
	if _, err := io.Copy(tmp, cmd.InOrStdin()); err != nil {
		done()
		return nil, "", nil, fmt.Errorf("read stdin: %w", err)
	}
	return tmp, "stdin", done, nil
}
