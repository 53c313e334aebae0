package report

import (
	"fmt"

	"github.com/drmas/drmas/pkg/rundir"
)

// metricsFile is the run's metrics.jsonl: a row per iteration, synced as written. The run depends
// on it: a failure to write ends the run.
type metricsFile struct{ dir string }

func openMetrics(r Run) (Output, error) { return metricsFile{r.Dir}, nil }

func (f metricsFile) Record(it Iteration) error {
	if err := rundir.AppendMetrics(f.dir, it.Metrics); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

func (metricsFile) Close() {}
