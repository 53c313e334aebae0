package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/inspect"
)

const (
	grpoRun  = "../../pkg/inspect/testdata/grpo"
	drmasRun = "../../pkg/inspect/testdata/drmas"
)

func TestInspectGradsCompare(t *testing.T) {
	png := filepath.Join(t.TempDir(), "grads.png")
	out, _, err := runDrmas(t, "", "inspect-grads", grpoRun, drmasRun, "--plot", png)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"run grpo:", "run drmas:", "comparison per agent", "grpo/drmas", "searcher"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	data, err := os.ReadFile(png)
	if err != nil || !strings.HasPrefix(string(data), "\x89PNG") {
		t.Errorf("plot file: %v, %d bytes", err, len(data))
	}
}

func TestInspectGradsJSON(t *testing.T) {
	out, _, err := runDrmas(t, "", "inspect-grads", grpoRun+"/metrics.jsonl", drmasRun,
		"--json", "--label", "GRPO", "--label", "Dr. MAS", "--spike-factor", "10")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Factor float64 `json:"spike_factor"`
		Runs   []struct {
			Label  string
			Spikes int
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	// Factor 10: the searcher's 30, 25 and 82.4 over a median of about 2 are still spikes, the answerer's
	// 9.5 over 0.6 too; the Dr. MAS run's 12 over 1.8 is not.
	if doc.Factor != 10 || len(doc.Runs) != 2 || doc.Runs[0].Label != "GRPO" || doc.Runs[1].Label != "Dr. MAS" ||
		doc.Runs[0].Spikes != 5 || doc.Runs[1].Spikes != 0 {
		t.Errorf("got %+v", doc)
	}
}

func TestInspectGradsMalformedIsNotFatal(t *testing.T) {
	out, _, err := runDrmas(t, "", "inspect-grads", "../../pkg/inspect/testdata/broken")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "5 malformed lines skipped") {
		t.Errorf("output:\n%s", out)
	}
}

func TestInspectGradsLogsFileLine(t *testing.T) {
	var buf bytes.Buffer
	saved, level := log.Logger, zerolog.GlobalLevel()
	log.Logger = zerolog.New(&buf)
	zerolog.SetGlobalLevel(zerolog.InfoLevel)
	defer func() { log.Logger = saved; zerolog.SetGlobalLevel(level) }()

	_, warns, err := inspect.ReadMetrics("../../pkg/inspect/testdata/broken")
	if err != nil {
		t.Fatal(err)
	}
	logWarnings("broken", warns)
	if !strings.Contains(buf.String(), "testdata/broken/metrics.jsonl:11: skipped: truncated line") {
		t.Errorf("log:\n%s", buf.String())
	}
	many := make([]inspect.Warning, maxLoggedWarnings+5)
	buf.Reset()
	logWarnings("x", many)
	if n := strings.Count(buf.String(), "\n"); n != maxLoggedWarnings+1 || !strings.Contains(buf.String(), "5 more warnings") {
		t.Errorf("%d log lines:\n%s", n, buf.String())
	}
}

func TestInspectGradsBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-run")
	for _, tc := range []struct {
		args []string
		has  string
	}{
		{[]string{missing}, missing},
		{[]string{t.TempDir()}, "metrics.jsonl"},
		{[]string{grpoRun, "--label", "a", "--label", "b"}, "2 --label flags for 1 runs"},
		{[]string{grpoRun, "--window", "0"}, "window"},
		{[]string{grpoRun, "--spike-factor", "-1"}, "spike factor"},
		{[]string{grpoRun, "--plot", "grads.bmp"}, ".png"},
		{nil, "requires at least 1 arg"},
	} {
		_, _, err := runDrmas(t, "", append([]string{"inspect-grads"}, tc.args...)...)
		var ue usageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.has) {
			t.Errorf("%v: error %v, want a usage error containing %q", tc.args, err, tc.has)
		}
	}
}

// The verdict at both ends of the dial (configs/toy-dial.yaml, docs/dial.md): after the format warm-up
// and two iterations, the counterfactual on the same weights says Dr. MAS matters for the Helper when
// the environment calls it only in failing episodes (p_wrong 1, p_right 0) and does not when its calls
// ignore the outcome (0.5, 0.5); the Solver, called once in every episode, is never flagged.
func TestInspectGradsDialVerdict(t *testing.T) {
	run := t.TempDir()
	cfg := "../../configs/toy-dial.yaml"
	toks := []string{"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json", "--set", "models.1.tokenizer=../../configs/toy/tokenizer.json",
		"--set", "toy.train=128", "--set", "toy.val=16", "--set", "run.val_limit=16"}
	if _, stderr, err := execDrmas(t, append([]string{"train", "--config", cfg, "--set", "run.dir=" + run, "--set", "run.steps=2",
		"--set", "run.test_freq=0"}, toks...)...); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	verdicts := func(pWrong, pRight string) map[string]inspect.Verdict {
		stdout, stderr, err := execDrmas(t, append([]string{"inspect-grads", "--config", cfg, "--checkpoint", filepath.Join(run, "step-2"),
			"--batches", "4", "--json", "--set", "orchestra.dial.p_wrong=" + pWrong, "--set", "orchestra.dial.p_right=" + pRight}, toks...)...)
		if err != nil {
			t.Fatalf("inspect-grads at %s:%s: %v\n%s", pWrong, pRight, err, stderr)
		}
		var rep struct {
			Verdicts []struct {
				Agent string   `json:"agent"`
				Scale *float64 `json:"scale"`
				Level string   `json:"level"`
				Text  string   `json:"text"`
			} `json:"verdicts"`
		}
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("%v\n%s", err, stdout)
		}
		out := map[string]inspect.Verdict{}
		for _, v := range rep.Verdicts {
			t.Logf("p_wrong %s, p_right %s: %s", pWrong, pRight, v.Text)
			out[v.Agent] = inspect.Verdict{Agent: v.Agent, Level: v.Level, Text: v.Text}
		}
		return out
	}
	far, near := verdicts("1", "0"), verdicts("0.5", "0.5")
	if v := far["helper"]; v.Level != inspect.Matters || !strings.Contains(v.Text, "Dr. MAS expected to matter") {
		t.Errorf("far end, helper: %+v", v)
	}
	if v := near["helper"]; v.Level != inspect.DoesNotMatter || !strings.Contains(v.Text, "not expected to matter") {
		t.Errorf("near end, helper: %+v", v)
	}
	for _, vs := range []map[string]inspect.Verdict{far, near} {
		if v := vs["solver"]; v.Level != inspect.DoesNotMatter {
			t.Errorf("solver: %+v", v)
		}
	}
	// The table ends with the same verdicts.
	stdout, _, err := execDrmas(t, append([]string{"inspect-grads", "--config", cfg, "--checkpoint", filepath.Join(run, "step-2"),
		"--batches", "3", "--set", "orchestra.dial.p_wrong=1", "--set", "orchestra.dial.p_right=0"}, toks...)...)
	if err != nil || !strings.Contains(stdout, "Verdict") || !strings.Contains(stdout, far["helper"].Text) {
		t.Errorf("table: %v\n%s", err, stdout)
	}
}
