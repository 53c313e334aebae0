package inspect

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The σ_k diagnostics (adv_std/agent/*, adv_norm/agent/*) are summarized per agent, printed, and
// cited by the verdict of an agent whose σ_k collapses in some groups; an agent without them, and
// a run without them, are reported as before.
func TestSigmaDiagnosticsInVerdict(t *testing.T) {
	dir := t.TempDir()
	rows := []string{
		`{"step":1,"grad_norm/agent/solver":1,"grad_norm/agent/verifier":1,"adv_energy_ratio/agent/solver":1.0,"adv_energy_ratio/agent/verifier":0.5,` +
			`"adv_std/agent/verifier/min":0.004,"adv_std/agent/verifier/median":0.3,"adv_std/agent/verifier/frac_below_0.01":0.25,"adv_norm/agent/verifier/abs_max":1.4,` +
			`"adv_std/agent/solver/min":0.2,"adv_std/agent/solver/median":0.5,"adv_std/agent/solver/frac_below_0.01":0,"adv_norm/agent/solver/abs_max":1.1}`,
		`{"step":2,"grad_norm/agent/solver":1,"grad_norm/agent/verifier":1,"adv_energy_ratio/agent/solver":1.0,"adv_energy_ratio/agent/verifier":0.5,` +
			`"adv_std/agent/verifier/min":0.002,"adv_std/agent/verifier/median":0.5,"adv_std/agent/verifier/frac_below_0.01":0.75,"adv_norm/agent/verifier/abs_max":2.0,` +
			`"adv_std/agent/solver/min":0.3,"adv_std/agent/solver/median":0.7,"adv_std/agent/solver/frac_below_0.01":0,"adv_norm/agent/solver/abs_max":0.9}`,
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run, _, err := ReadMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Summarize([]*Run{run}, nil, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var solver, verifier AgentSummary
	for _, a := range rep.Runs[0].Agents {
		if a.Name == "solver" {
			solver = a
		} else {
			verifier = a
		}
	}
	v := verifier.Sigma
	if v == nil || v.Min != 0.002 || v.Median != 0.4 || v.FracLow != 0.5 || v.AbsAdMax != 2 {
		t.Fatalf("verifier σ_k summary %+v", v)
	}
	if !strings.Contains(verifier.Verdict, "σ_k < 0.01 in 50% of its groups (min σ_k 0.002, max |A| 2)") {
		t.Errorf("verifier verdict does not cite its σ_k: %q", verifier.Verdict)
	}
	if solver.Sigma == nil || strings.Contains(solver.Verdict, "σ_k") {
		t.Errorf("solver: σ_k %+v, verdict %q (no collapse: no citation)", solver.Sigma, solver.Verdict)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "σ_k median") || !strings.Contains(out, "σ_k < 0.01 in 50%") {
		t.Errorf("text lacks the σ_k table or citation:\n%s", out)
	}
	_, fixture := readFixtures(t) // runs without the keys: no σ_k
	for _, a := range fixture.Runs[0].Agents {
		if a.Sigma != nil {
			t.Errorf("fixture agent %s: σ_k %+v from no keys", a.Name, a.Sigma)
		}
	}
}
