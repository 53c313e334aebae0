package inspect

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func cfRow(batch int, agent string, g, d, eg, ed, infl float64) CounterfactualRow {
	r := CounterfactualRow{Batch: batch, Agent: agent, Calls: 8, Norms: map[string]float64{"grpo": g, "drmas": d},
		Energy: map[string]float64{"grpo": eg, "drmas": ed, "grpo" + Centered: eg / 2, "drmas" + Centered: ed,
			"grpo" + Weighted: eg / 4, "drmas" + Weighted: ed / 4}, Predicted: infl}
	r.Fill()
	return r
}

func TestRatio(t *testing.T) {
	for _, c := range []struct{ num, den, want float64 }{
		{4, 2, 2}, {3, 0, math.Inf(1)}, {0, 0, math.NaN()}, {math.NaN(), 1, math.NaN()}, {0, 5, 0},
	} {
		got := Ratio(c.num, c.den)
		if !(got == c.want || math.IsNaN(got) && math.IsNaN(c.want)) {
			t.Errorf("Ratio(%g, %g) = %g, want %g", c.num, c.den, got, c.want)
		}
	}
}

// +Inf ranks above every finite value: a predictor that is infinite exactly where the measured ratio
// is correlates perfectly; NaN pairs are left out.
func TestSpearmanInfinite(t *testing.T) {
	inf := math.Inf(1)
	xs := []float64{1, 2, 3, inf, math.NaN()}
	ys := []float64{10, 20, 30, inf, 5}
	rep := &CounterfactualReport{}
	for i := range xs {
		rep.Rows = append(rep.Rows, CounterfactualRow{Measured: ys[i], AdvRatio: xs[i], Predicted: -xs[i]})
	}
	rep.Correlate()
	if rep.AdvPairs != 4 || math.Abs(rep.SpearmanAdv-1) > 1e-12 {
		t.Errorf("energy: Spearman %g over %d pairs, want 1 over 4", rep.SpearmanAdv, rep.AdvPairs)
	}
	if rep.Pairs != 4 || math.Abs(rep.Spearman+1) > 1e-12 { // -Inf ranks below everything
		t.Errorf("inflation: Spearman %g over %d pairs, want -1 over 4", rep.Spearman, rep.Pairs)
	}
	lo, hi := SpearmanCI([]float64{1, 2, 3, 4, 5, 6}, []float64{1, 3, 2, 4, 6, 5}, 0.95, 500)
	if !(lo <= hi && lo >= -1 && hi <= 1) {
		t.Errorf("interval [%g, %g]", lo, hi)
	}
}

func TestVerdicts(t *testing.T) {
	rep := &CounterfactualReport{Rows: []CounterfactualRow{
		cfRow(1, "helper", 1, 0, 30, 0, 4), cfRow(2, "helper", 1, 0, 20, 0, 4), cfRow(3, "helper", 2, 1, 20, 2, 4), // ∞, ∞, 4
		cfRow(1, "solver", 1, 1, 5, 5, 1), cfRow(2, "solver", 1.1, 1, 5, 5, 1), cfRow(3, "solver", 0.9, 1, 5, 5, 1),
		cfRow(1, "judge", 3, 1, 9, 1, 2), cfRow(2, "judge", 2, 1, 4, 1, 2),
		cfRow(1, "idle", 0, 0, 0, 0, math.NaN()),
	}}
	vs := rep.Verdicts()
	if len(vs) != 4 {
		t.Fatalf("%d verdicts, want 4", len(vs))
	}
	h, s, j, idle := vs[0], vs[1], vs[2], vs[3]
	// helper: energy ratios ∞, ∞, 10 → ∞; measured ∞, ∞, 4 → ∞.
	if !math.IsInf(h.Scale, 1) || h.Level != Matters || !strings.Contains(h.Text, "no advantage") || !strings.Contains(h.Text, "expected to matter") {
		t.Errorf("helper: %+v", h)
	}
	// solver: energy ratios 1 → not expected; measured 1, 1.21, 0.81 → 1.
	if s.Scale != 1 || s.Level != DoesNotMatter || !strings.Contains(s.Text, "≈ 1×") || !strings.Contains(s.Text, "not expected to matter") ||
		!strings.Contains(s.Text, "measured on these batches: 1×") {
		t.Errorf("solver: %+v", s)
	}
	// judge: energy ratios 9 and 4 → 6.5.
	if j.Scale != 6.5 || j.Level != Matters || !strings.Contains(j.Text, "≈ 6.5×: Dr. MAS expected to matter") {
		t.Errorf("judge: %+v", j)
	}
	if idle.Batches != 0 || idle.Level != "" || !strings.Contains(idle.Text, "no verdict") {
		t.Errorf("idle: %+v", idle)
	}
	for _, c := range []struct {
		scale float64
		level string
	}{{1.19, DoesNotMatter}, {1.2, MayMatter}, {1.99, MayMatter}, {2, Matters}} {
		if v := Judge("a", c.scale, math.NaN()); v.Level != c.level || strings.Contains(v.Text, "measured") {
			t.Errorf("Judge(%g): %+v, want level %q", c.scale, v, c.level)
		}
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf, []string{"grpo", "drmas"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "Verdict") || !strings.Contains(buf.String(), j.Text) {
		t.Errorf("table lacks the verdicts:\n%s", buf.String())
	}
}

// A report survives its file: the infinite ratios (nulls in JSON) come back from the norms and energies.
func TestCounterfactualRoundTrip(t *testing.T) {
	rep := &CounterfactualReport{Rows: []CounterfactualRow{cfRow(1, "helper", 1, 0, 30, 0, 4), cfRow(1, "solver", 2, 1, 8, 2, 1.5),
		cfRow(2, "helper", 1, 0.5, 30, 3, 4), cfRow(2, "solver", 2, 2, 8, 8, 1)}}
	rep.Correlate()
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cf.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCounterfactual(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range back.Rows {
		w := rep.Rows[i]
		for _, p := range [][2]float64{{r.Measured, w.Measured}, {r.AdvRatio, w.AdvRatio}, {r.CenteredRatio, w.CenteredRatio},
			{r.WeightedRatio, w.WeightedRatio}, {r.Predicted, w.Predicted}} {
			if p[0] != p[1] {
				t.Errorf("row %d: %g after the file, %g before", i, p[0], p[1])
			}
		}
	}
	if !math.IsInf(back.Rows[0].Measured, 1) || back.Spearman != rep.Spearman || back.SpearmanAdv != rep.SpearmanAdv {
		t.Errorf("read back: %+v", back)
	}
	if err := os.WriteFile(path, []byte(`{"rows": [{"agent": "a", "norms": {"grpo": 1}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCounterfactual(path); err == nil || !strings.Contains(err.Error(), "rows[0]") {
		t.Errorf("a row without energies: %v", err)
	}
}

func TestPool(t *testing.T) {
	a := &CounterfactualReport{Rows: []CounterfactualRow{cfRow(1, "helper", 1, 1, 1, 1, 1), cfRow(2, "helper", 1.2, 1, 1.1, 1, 1)}}
	b := &CounterfactualReport{Rows: []CounterfactualRow{cfRow(1, "helper", 3, 1, 12, 1, 2), cfRow(2, "helper", 1, 0, 5, 0, 3)}}
	c := &CounterfactualReport{Rows: []CounterfactualRow{cfRow(1, "helper", 2, 1, 6, 1, 5)}}
	p := Pool([]string{"near", "far", "far"}, []*CounterfactualReport{a, b, c})
	if len(p.Rows) != 5 || len(p.Cells) != 2 {
		t.Fatalf("%d rows and %d cells, want 5 and 2", len(p.Rows), len(p.Cells))
	}
	far := p.Cells[1]
	if far.Label != "far" || far.Rows != 3 || far.Measured != 9 || far.Energy != 12 || far.Inflation != 3 {
		t.Errorf("far cell %+v, want medians measured 9 (of 4, 9, ∞), energy 12 (of 6, 12, ∞), inflation 3", far)
	}
	energy := p.Correlations[1]
	if energy.Predictor != "energy" || energy.Pairs != 5 || math.Abs(energy.Spearman-1) > 1e-12 {
		t.Errorf("energy correlation %+v, want 1 over 5 rows", energy)
	}
	var img bytes.Buffer
	if err := PlotPooled(&img, p, PlotOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&img); err != nil {
		t.Errorf("not a PNG: %v", err)
	}
}
