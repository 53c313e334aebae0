package inspect

import (
	"bytes"
	"encoding/json"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// readFixtures reads testdata/grpo and testdata/drmas and summarizes them with the default rule.
func readFixtures(t *testing.T) ([]*Run, *Report) {
	t.Helper()
	var runs []*Run
	var warns [][]Warning
	for _, f := range fixtures {
		run, w, err := ReadMetrics(filepath.Join("testdata", f.name))
		if err != nil {
			t.Fatal(err)
		}
		if len(w) != 0 {
			t.Fatalf("%s: warnings %v", f.name, w)
		}
		runs, warns = append(runs, run), append(warns, w)
	}
	rep, err := Summarize(runs, warns, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	return runs, rep
}

// TestSummarizeFindsPlantedSpikes: the synthetic runs' spikes are found exactly, no more, no fewer.
func TestSummarizeFindsPlantedSpikes(t *testing.T) {
	_, rep := readFixtures(t)
	for i, f := range fixtures {
		s := rep.Runs[i]
		total := 0
		for _, a := range s.Agents {
			want := f.wantSpikes[a.Name]
			if !slices.Equal(a.SpikeSteps, want) || a.Spikes != len(want) {
				t.Errorf("%s/%s: spikes at %v (%d), want %v", f.name, a.Name, a.SpikeSteps, a.Spikes, want)
			}
			total += len(want)
		}
		if s.Spikes != total {
			t.Errorf("%s: %d spikes in all, want %d", f.name, s.Spikes, total)
		}
		// Non-shared models: each model's series is its agent's.
		for _, m := range s.Models {
			agent := strings.TrimSuffix(m.Name, "-7b")
			if !slices.Equal(m.SpikeSteps, f.wantSpikes[agent]) {
				t.Errorf("%s/model %s: spikes at %v, want %v", f.name, m.Name, m.SpikeSteps, f.wantSpikes[agent])
			}
		}
	}

	grpo := rep.Runs[0]
	searcher := grpo.Agents[slices.IndexFunc(grpo.Agents, func(a AgentSummary) bool { return a.Name == "searcher" })]
	if searcher.Points != fixtureSteps || searcher.NonFinite != 2 || float64(searcher.Max) != 82.4 ||
		searcher.Model != "searcher-7b" || searcher.SkippedSteps == nil || *searcher.SkippedSteps != 3 {
		t.Errorf("grpo searcher: points %d, non-finite %d, max %v, model %q, skipped %v",
			searcher.Points, searcher.NonFinite, searcher.Max, searcher.Model, searcher.SkippedSteps)
	}
	if infl := float64(searcher.Inflation); math.Abs(infl-4.1) > 0.05 {
		t.Errorf("grpo searcher inflation %v, want ≈ 4.1", infl)
	}
	if infl := float64(rep.Runs[1].Agents[0].Inflation); infl != 1 {
		t.Errorf("drmas inflation %v, want 1", infl)
	}
}

func TestSummarizeStatistics(t *testing.T) {
	// Norms 1..20 and two nulls; nonfinite counts 1 and 2; the agent trains model m (from the config).
	var b strings.Builder
	for i := 1; i <= 22; i++ {
		norm, skipped := float64(i), 0
		line := `{"step":` + itoa(i) + `,"grad_norm/agent/a":` + fnum(norm) + `,"nonfinite/model/m":0,"inflation/agent/a":2,"adv_energy_ratio/agent/a":` + fnum(float64(i%2+1)) + `}`
		if i == 5 || i == 6 {
			skipped = i - 4
			line = `{"step":` + itoa(i) + `,"grad_norm/agent/a":null,"nonfinite/model/m":` + itoa(skipped) + `,"inflation/agent/a":null}`
		}
		b.WriteString(line + "\n")
	}
	run, _, err := ReadMetrics(writeMetrics(t, "stats", b.String()))
	if err != nil {
		t.Fatal(err)
	}
	run.AgentModel = map[string]string{"a": "m"}
	rep, err := Summarize([]*Run{run}, nil, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	a := rep.Runs[0].Agents[0]
	// Finite norms: 1..4, 7..22 (20 values): median (12+13)/2 = 12.5; p95 at rank 18.05 → 21.05.
	if a.Points != 22 || a.NonFinite != 2 || a.Median != 12.5 || math.Abs(float64(a.P95)-21.05) > 1e-9 ||
		a.Max != 22 || *a.SkippedSteps != 3 || a.Inflation != 2 || a.Spikes != 0 || a.EnergyRatio != 1.5 {
		t.Errorf("got %+v (skipped %d)", a, *a.SkippedSteps)
	}
	if m := rep.Runs[0].Models[0]; m.Name != "m" || m.SkippedSteps != 3 || m.Points != 0 || !math.IsNaN(float64(m.Median)) {
		t.Errorf("model: %+v", m)
	}
}

func TestSummarizeMinNormAndLabels(t *testing.T) {
	// A zero plateau then 0.01 is a spike by the ratio alone; a floor of 1 (docs/toy-tasks.md) drops it.
	text := ""
	for i := 1; i <= 12; i++ {
		v := "0"
		if i == 12 {
			v = "0.01"
		}
		text += `{"step":` + itoa(i) + `,"grad_norm/agent/a":` + v + "}\n"
	}
	run, _, err := ReadMetrics(writeMetrics(t, "x", text))
	if err != nil {
		t.Fatal(err)
	}
	for floor, want := range map[float64]int{0: 1, 1: 0} {
		opt := DefaultOptions()
		opt.MinNorm = floor
		rep, err := Summarize([]*Run{run, run, run}, nil, opt)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Runs[0].Spikes != want {
			t.Errorf("floor %v: %d spikes, want %d", floor, rep.Runs[0].Spikes, want)
		}
		labels := []string{rep.Runs[0].Label, rep.Runs[1].Label, rep.Runs[2].Label}
		if !slices.Equal(labels, []string{"x", "x #2", "x #3"}) {
			t.Errorf("labels %v", labels)
		}
	}
	for _, bad := range []Options{{Factor: 0, Window: 20}, {Factor: 5, Window: 0}, {Factor: 5, Window: 20, MinNorm: -1}, {Factor: math.NaN(), Window: 20}} {
		if _, err := Summarize(nil, nil, bad); err == nil {
			t.Errorf("options %+v accepted", bad)
		}
	}
}

func TestReportJSON(t *testing.T) {
	_, rep := readFixtures(t)
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Factor *float64 `json:"spike_factor"`
		Window *int     `json:"window"`
		Runs   []struct {
			Label, Normalization string
			Rows, Spikes         int
			MalformedLines       *int `json:"malformed_lines"`
			Agents               []map[string]any
			Models               []map[string]any
			Warnings             []any
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Factor == nil || *doc.Factor != 5 || doc.Window == nil || *doc.Window != 20 || len(doc.Runs) != 2 {
		t.Fatalf("top level: %s", buf.String()[:200])
	}
	r := doc.Runs[0]
	if r.Label != "grpo" || r.Normalization != "grpo" || r.Rows != fixtureSteps || r.Spikes != 5 ||
		r.MalformedLines == nil || r.Warnings == nil || len(r.Agents) != 3 || len(r.Models) != 3 {
		t.Errorf("run: %+v", r)
	}
	wantKeys := []string{"energy_ratio", "inflation", "max", "median", "model", "name", "nonfinite", "p95", "points", "skipped_steps", "spike_steps", "spikes"}
	for _, a := range r.Agents {
		keys := make([]string, 0, len(a))
		for k := range a {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, wantKeys) {
			t.Errorf("agent keys %v, want %v", keys, wantKeys)
		}
		if a["name"] == "searcher" {
			steps, _ := a["spike_steps"].([]any)
			if len(steps) != 4 || steps[0] != 11.0 || steps[3] != 85.0 || a["skipped_steps"] != 3.0 {
				t.Errorf("searcher: %v", a)
			}
		}
		if a["name"] == "verifier" {
			if steps, ok := a["spike_steps"].([]any); !ok || len(steps) != 0 {
				t.Errorf("verifier spike_steps = %v, want []", a["spike_steps"])
			}
		}
	}
	// Non-finite statistics are null, not an encoding error.
	var b bytes.Buffer
	empty, err := Summarize([]*Run{{Label: "e", GradAgent: map[string]Series{"a": {Steps: []int{1}, Values: []float64{nan}}}}}, nil, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := empty.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"median": null`) || !strings.Contains(b.String(), `"skipped_steps": null`) {
		t.Errorf("empty series JSON: %s", b.String())
	}
}

func TestReportText(t *testing.T) {
	_, rep := readFixtures(t)
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"spike = norm > 5 × median of the previous 20 finite norms",
		"run grpo: testdata/grpo/metrics.jsonl (normalization grpo)",
		"120 rows, steps 1–120; 5 spikes",
		"comparison per agent",
		"grpo/drmas",
		"comparison per model",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	// The comparison's searcher rows: max 82.4 vs the Dr. MAS run's 12, spikes 4 vs 1 (ratio 4.00×).
	lines := strings.Split(out, "\n")
	cmp := slices.Index(lines, "comparison per agent")
	fields := func(prefix string) []string {
		for _, l := range lines[cmp:] {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return f
			}
		}
		return nil
	}
	if f := fields("searcher"); len(f) != 5 || f[1] != "median" {
		t.Errorf("searcher row: %v", f)
	}
	var sawMax, sawSpikes bool
	inSearcher := false
	for _, l := range lines[cmp:] {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if f[0] == "searcher" {
			inSearcher = true
		} else if f[0] == "verifier" || f[0] == "answerer" || f[0] == "(run)" {
			inSearcher = false
		}
		if inSearcher && slices.Equal(f, []string{"max", "82.4", "12", "6.87×"}) {
			sawMax = true
		}
		if inSearcher && slices.Equal(f, []string{"spikes", "4", "1", "4.00×"}) {
			sawSpikes = true
		}
	}
	if !sawMax || !sawSpikes {
		t.Errorf("comparison lacks the searcher's max/spikes rows:\n%s", out)
	}
	// Columns are aligned: every row of a table has its last cell ending at the same column (the
	// rows line has no ratio).
	var widths []int
	for _, l := range lines[cmp+1:] {
		if l == "" {
			break
		}
		if f := strings.Fields(l); f[0] != "rows" {
			widths = append(widths, len([]rune(l)))
		}
	}
	for _, w := range widths {
		if w != widths[0] {
			t.Errorf("comparison rows have different widths %v:\n%s", widths, out)
			break
		}
	}

	// One run: no comparison.
	one := &Report{Options: rep.Options, Runs: rep.Runs[:1]}
	buf.Reset()
	if err := one.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "comparison") {
		t.Errorf("one run printed a comparison:\n%s", buf.String())
	}
}
