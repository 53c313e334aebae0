package inspect

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReadMetricsBroken reads a file with every kind of bad line: each is reported with its line number
// and skipped, and the good rows are all kept.
func TestReadMetricsBroken(t *testing.T) {
	path := filepath.Join("testdata", "broken", MetricsFile)
	run, warns, err := ReadMetrics(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		line int
		has  string
	}{
		{4, "malformed JSON"},
		{6, "not a JSON object"},
		{7, `no "step"`},
		{8, `"step" is "four"`},
		{9, `key "grad_norm/agent/solver": want a number or null`},
		{10, "step 2 repeats line 2"},
		{11, "truncated line"},
	}
	if len(warns) != len(want) {
		t.Fatalf("%d warnings, want %d: %v", len(warns), len(want), warns)
	}
	for i, w := range want {
		got := warns[i]
		if got.Line != w.line || got.File != path || !strings.Contains(got.Message, w.has) {
			t.Errorf("warning %d = %v, want %s:%d: …%s…", i, got, path, w.line, w.has)
		}
	}
	if !strings.HasPrefix(warns[0].String(), path+":4: skipped: malformed JSON") {
		t.Errorf("warning text %q does not start with file:line", warns[0].String())
	}
	if run.Lines != 11 || run.Malformed != 5 || run.Duplicates != 1 {
		t.Errorf("lines %d, malformed %d, duplicates %d; want 11, 5, 1", run.Lines, run.Malformed, run.Duplicates)
	}
	if !slices.Equal(run.Steps, []int{1, 2, 3, 4}) {
		t.Errorf("steps %v, want [1 2 3 4]", run.Steps)
	}
	solver := run.GradAgent["solver"]
	if !slices.Equal(solver.Steps, []int{1, 2, 3}) || solver.Values[0] != 1 || solver.Values[1] != 1.3 || !math.IsNaN(solver.Values[2]) {
		t.Errorf("solver = %+v, want steps [1 2 3], values [1 1.3 NaN] (the duplicate's last row; null as NaN)", solver)
	}
	if m := run.GradModel["m"]; !slices.Equal(m.Steps, []int{4}) || m.Values[0] != 0.9 {
		t.Errorf("model m = %+v", m)
	}
	if run.Label != "broken" || run.Config != "" || run.AgentModel != nil {
		t.Errorf("label %q, config %q, agent→model %v", run.Label, run.Config, run.AgentModel)
	}

	rep, err := Summarize([]*Run{run}, [][]Warning{warns}, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Runs[0]
	a, m := s.Agents[0], s.Models[0]
	if s.MalformedLines != 5 || a.NonFinite != 1 || a.SkippedSteps != nil || m.SkippedSteps != 2 || len(s.Warnings) != 7 {
		t.Errorf("summary: malformed %d, agent non-finite %d, agent skipped %v, model skipped %d, %d warnings",
			s.MalformedLines, a.NonFinite, a.SkippedSteps, m.SkippedSteps, len(s.Warnings))
	}
}

func TestReadMetricsPaths(t *testing.T) {
	byDir, _, err := ReadMetrics(filepath.Join("testdata", "grpo"))
	if err != nil {
		t.Fatal(err)
	}
	byFile, _, err := ReadMetrics(filepath.Join("testdata", "grpo", MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []*Run{byDir, byFile} {
		if run.Label != "grpo" || run.Normalization != "grpo" || run.AgentModel["searcher"] != "searcher-7b" ||
			run.Config != filepath.Join("testdata", "grpo", ConfigFile) {
			t.Errorf("%s: label %q, normalization %q, agent→model %v, config %q",
				run.File, run.Label, run.Normalization, run.AgentModel, run.Config)
		}
		if !slices.Equal(run.Agents(), []string{"answerer", "searcher", "verifier"}) ||
			!slices.Equal(run.Models(), []string{"answerer-7b", "searcher-7b", "verifier-7b"}) {
			t.Errorf("agents %v, models %v", run.Agents(), run.Models())
		}
		if len(run.Steps) != fixtureSteps || len(run.GradAgent["searcher"].Values) != fixtureSteps {
			t.Errorf("%d steps", len(run.Steps))
		}
	}

	// A file not named metrics.jsonl is labelled by its own name.
	dir := t.TempDir()
	other := filepath.Join(dir, "seed3.jsonl")
	if err := os.WriteFile(other, []byte(`{"step":1,"grad_norm/agent/a":"NaN"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run, warns, err := ReadMetrics(other)
	if err != nil || len(warns) != 0 {
		t.Fatal(err, warns)
	}
	if run.Label != "seed3" || !math.IsNaN(run.GradAgent["a"].Values[0]) {
		t.Errorf("label %q, values %v (the string NaN is non-finite)", run.Label, run.GradAgent["a"].Values)
	}

	// Missing run directory, or a directory without metrics.jsonl: errors naming it.
	for _, p := range []string{filepath.Join(dir, "nope"), dir} {
		if _, _, err := ReadMetrics(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("ReadMetrics(%s) error = %v, want one naming it", p, err)
		}
	}
}

func TestReadMetricsConfig(t *testing.T) {
	dir := writeMetrics(t, "custom", `{"step":1,"grad_norm/agent/a":1}`+"\n")
	cfg := "agents:\n  - {name: a, model: shared}\n  - {name: b, model: shared}\nalgorithm:\n  normalization: {mean: agent, std: global, weighting: step}\n"
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	run, warns, err := ReadMetrics(dir)
	if err != nil || len(warns) != 0 {
		t.Fatal(err, warns)
	}
	if run.Normalization != "mean=agent,std=global,weighting=step" || run.AgentModel["b"] != "shared" {
		t.Errorf("normalization %q, agent→model %v", run.Normalization, run.AgentModel)
	}

	// A config that does not parse is a warning, not an error.
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte("agents: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run, warns, err = ReadMetrics(dir)
	if err != nil || len(warns) != 1 || run.AgentModel != nil || !strings.Contains(warns[0].String(), ConfigFile) {
		t.Errorf("bad config: err %v, warnings %v, agent→model %v", err, warns, run.AgentModel)
	}
}

func TestReadMetricsEmpty(t *testing.T) {
	run, warns, err := ReadMetrics(writeMetrics(t, "empty", "\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Steps) != 0 || len(warns) != 1 || !strings.Contains(warns[0].Message, "no metrics rows") {
		t.Errorf("steps %v, warnings %v", run.Steps, warns)
	}
}
