package train

import (
	"maps"
	"math"
	"testing"

	"github.com/drmas/drmas/pkg/report"
)

// rowsOutput is what a new reporter output's file holds: it keeps every iteration's row and each
// agent's advantage count.
type rowsOutput struct {
	rows   []map[string]float64
	advs   []int
	closed bool
}

func (o *rowsOutput) Record(it report.Iteration) error {
	o.rows = append(o.rows, maps.Clone(it.Metrics))
	n := 0
	for _, a := range it.Advantages {
		n += len(a)
	}
	o.advs = append(o.advs, n)
	return nil
}

func (o *rowsOutput) Close() { o.closed = true }

// A new reporter output is its file plus one registration line (AddOutputForTest makes that line
// for the test): with nothing else changed, a run hands it every iteration — the row metrics.jsonl
// holds, throughput included, and the iteration's advantages — and closes it at the end.
func TestNewReportOutputNeedsOneRegistration(t *testing.T) {
	out := &rowsOutput{}
	t.Cleanup(report.AddOutputForTest("rows", func(report.Run) (report.Output, error) { return out, nil }))
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=2", "warmup.steps=0"), Options{})
	rows := readRows(t, dir)
	if len(out.rows) != 2 || len(rows) != 2 || !out.closed {
		t.Fatalf("the output saw %d rows (closed: %v), metrics.jsonl holds %d", len(out.rows), out.closed, len(rows))
	}
	for i, r := range rows {
		for k, v := range r {
			if k == "nonfinite_values" { // the file's count of its nulls
				continue
			}
			want, finite := v.(float64) // null: not finite
			got, ok := out.rows[i][k]
			if !ok || (finite && got != want) || (!finite && !math.IsNaN(got) && !math.IsInf(got, 0)) {
				t.Errorf("row %d: %s = %v in the output, %v in metrics.jsonl", i+1, k, got, v)
			}
		}
		if _, ok := out.rows[i]["perf/tokens_per_s/small"]; !ok {
			t.Errorf("row %d: no throughput for model small", i+1)
		}
		if out.advs[i] < 4*4*2 { // 4 tasks × 4 samples, each a solver and a verifier call at least
			t.Errorf("row %d: %d advantages, want one per call (≥ 32)", i+1, out.advs[i])
		}
	}
}
