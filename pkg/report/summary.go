package report

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/inspect"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/rundir"
)

// curves.svg is the reporter's too.
var _ = rundir.Own(inspect.CurvesFile)

// summarize ends a run on rank 0: it draws the run's curves into the run folder (curves.svg, from
// metrics.jsonl: the whole run, resumed segments included) and logs what a person looks for when
// training ends: the steps, the reward and validation first → last, the time taken, and where the
// checkpoint, the curves and the TensorBoard files are. Drawing is a side output: a failure is logged.
//
// dir is the run folder, step the last iteration, from the step this process started at, valK the
// validation's k, board whether TensorBoard files are written; w says what went wrong meanwhile.
func summarize(dir string, step, from, valK int, board bool, began time.Time, w *watch) {
	took := time.Since(began).Round(time.Second)
	ev := log.Info().Str("steps", fmt.Sprintf("%d–%d", from+1, step))
	if from >= step {
		ev = log.Info().Int("step", step)
	}
	c, _, err := inspect.ReadCurves(dir)
	if err != nil {
		log.Warn().Err(err).Msg("no curves drawn")
		c = nil
	}
	if c != nil && len(c.Steps) > 0 {
		if from > 0 { // resumed: the run's steps besides this segment's
			ev = ev.Str("run_steps", fmt.Sprintf("%d–%d", c.Steps[0], c.Steps[len(c.Steps)-1]))
		}
		k := strconv.Itoa(valK)
		for _, f := range []struct{ name, key string }{
			{"reward", metric.RewardMean},
			{"val_avg@" + k, metric.ValAvgAt(valK)},
			{"val_pass@" + k, metric.ValPassAt(valK)},
		} {
			if first, last, s0, s1, ok := c.FirstLast(f.key); ok {
				ev = ev.Str(f.name, fmt.Sprintf("%.4g → %.4g (steps %d → %d)", first, last, s0, s1))
			}
		}
		path := filepath.Join(dir, inspect.CurvesFile)
		err := atomicfile.Write(path, func(w io.Writer) error {
			return inspect.PlotCurves(w, c, inspect.PlotOptions{Format: "svg"})
		})
		if err != nil {
			log.Warn().Err(err).Msg("no curves drawn")
		} else {
			ev = ev.Str("curves", path)
		}
	}
	ev = w.summary(ev).Str("took", took.String()).Str("checkpoint", rundir.CheckpointDir(dir, step))
	if board && boardDirExists(dir) {
		ev = ev.Str("tensorboard", filepath.Join(dir, TensorBoardDir))
	}
	ev.Msg("training done")
}
