package train

import (
	"context"
	"math"
	"path/filepath"
	"reflect"
	"testing"
)

// Counterfactual mode on a tiny math team after a format warm-up (so that groups have variance): one
// row per agent and batch, every normalization's norm measured, the measured ratio is
// (|g_grpo| / |g_drmas|)², the advantage ratio is finite where Dr. MAS gave the agent any gradient,
// and a rerun gives the same report.
func TestCounterfactual(t *testing.T) {
	dir := t.TempDir()
	cfg := tinyConfig(t, dir, "algorithm.group_size=8", "run.steps=1", "warmup.steps=40", "warmup.lr=1e-2")
	train(t, cfg, Options{})
	run := func() *CounterfactualReport {
		team, err := LoadTeam(cfg, "cpu", filepath.Join(dir, "step-1"))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Counterfactual(context.Background(), team, 2)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rep := run()
	seen := map[[2]any]bool{}
	for _, r := range rep.Rows {
		seen[[2]any{r.Batch, r.Agent}] = true
		if r.Calls < 1 {
			t.Errorf("%+v: no calls", r)
		}
		for _, m := range Normalizations {
			if n, ok := r.Norms[m.Name]; !ok || !isFinite(n) || n < 0 {
				t.Errorf("batch %d %s: norm under %s = %v", r.Batch, r.Agent, m.Name, n)
			}
		}
		g, d := r.Norms["grpo"], r.Norms["drmas"]
		if d > 0 && math.Abs(r.Measured-g*g/(d*d)) > 1e-12*r.Measured {
			t.Errorf("batch %d %s: measured %g, want %g", r.Batch, r.Agent, r.Measured, g*g/(d*d))
		}
		if d > 0 && (!isFinite(r.AdvRatio) || r.AdvRatio < 0) {
			t.Errorf("batch %d %s: advantage ratio %g with a non-zero Dr. MAS gradient", r.Batch, r.Agent, r.AdvRatio)
		}
	}
	for b := 1; b <= 2; b++ {
		for _, a := range []string{"solver", "verifier"} {
			if !seen[[2]any{b, a}] {
				t.Errorf("no row for batch %d %s", b, a)
			}
		}
	}
	if rep.AdvPairs < 1 || rep.SpearmanAdv < -1 || rep.SpearmanAdv > 1 {
		t.Errorf("advantage pairs %d, Spearman %g", rep.AdvPairs, rep.SpearmanAdv)
	}
	if again := run(); !reflect.DeepEqual(nanless(rep), nanless(again)) {
		t.Error("counterfactual reports differ between reruns")
	}
}

// nanless replaces NaNs (which never compare equal) so that reports can be compared.
func nanless(r *CounterfactualReport) *CounterfactualReport {
	c := *r
	c.Rows = append([]CounterfactualRow(nil), r.Rows...)
	fix := func(x *float64) {
		if math.IsNaN(*x) {
			*x = -1
		}
	}
	for i := range c.Rows {
		fix(&c.Rows[i].Measured)
		fix(&c.Rows[i].Predicted)
		fix(&c.Rows[i].AdvRatio)
	}
	fix(&c.Spearman)
	fix(&c.SpearmanAdv)
	return &c
}
