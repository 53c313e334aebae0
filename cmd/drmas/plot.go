package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/inspect"
)

func newPlotCmd() *cobra.Command {
	var out string
	var logY bool
	cmd := &cobra.Command{
		Use:   "plot RUN",
		Short: "Draw a run's curves: reward per agent, validation, gradient norms, time split, tokens/s",
		Long: `Read a run's metrics.jsonl (RUN is a run directory, or a metrics file) and draw, one panel
each over the steps: the mean reward and each agent's, validation avg@k and pass@k (per
dataset too when there are several), each agent's pre-clip gradient norm, where an
iteration's time went (rollout, update, validation, weight sync, communication) and the
tokens per second. Panels without data are left out. Training draws the same curves into
the run folder (curves.svg) when it ends; this command draws them at any time, a running
run included. The file written is printed on stdout.`,
		Example: `  drmas plot runs/toy-math                      # writes runs/toy-math/curves.svg
  drmas plot runs/toy-math -o toy-math.png
  drmas plot runs/toy-search/metrics.jsonl -o search.pdf --log-y`,
		Args: func(cmd *cobra.Command, args []string) error { return badInput(cobra.ExactArgs(1)(cmd, args)) },
		RunE: func(cmd *cobra.Command, args []string) error {
			run := args[0]
			if out == "" {
				dir := run
				if st, err := os.Stat(run); err == nil && !st.IsDir() {
					dir = filepath.Dir(run)
				}
				out = filepath.Join(dir, inspect.CurvesFile)
			}
			format, err := plotFormat(out)
			if err != nil {
				return badInput(fmt.Errorf("-o %s: want a .svg, .png, .pdf, .jpg or .tiff file", out))
			}
			c, warns, err := inspect.ReadCurves(run)
			if err != nil {
				return badInput(err)
			}
			logWarnings(c.Label, warns)
			err = atomicfile.Write(out, func(w io.Writer) error {
				return inspect.PlotCurves(w, c, inspect.PlotOptions{Format: format, LogY: logY})
			})
			if err != nil {
				return err
			}
			log.Info().Str("file", out).Int("steps", len(c.Steps)).Msg("curves written")
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "the image to write (.svg, .png, .pdf, .jpg, .tiff; default RUN/curves.svg)")
	cmd.Flags().BoolVar(&logY, "log-y", false, "log y axis on the gradient norm panel (default: only where norms span more than 2 decades)")
	return cmd
}
