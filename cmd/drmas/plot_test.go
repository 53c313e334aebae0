package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// drmas plot draws a run's curves into the file named (default RUN/curves.svg), printing its path on
// stdout; a file of an unknown format or a missing run is bad input.
func TestPlotCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "curves.png")
	stdout, _, err := execDrmas(t, "plot", "../../pkg/inspect/testdata/grpo", "-o", out)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(stdout) != out {
		t.Fatalf("stdout %q, want the file's path", stdout)
	}
	b, err := os.ReadFile(out)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("not a PNG: %v", err)
	}

	run := t.TempDir()
	src, _ := os.ReadFile("../../pkg/inspect/testdata/drmas/metrics.jsonl")
	os.WriteFile(filepath.Join(run, "metrics.jsonl"), src, 0o644)
	stdout, _, err = execDrmas(t, "plot", run)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(run, "curves.svg")
	if b, err := os.ReadFile(want); err != nil || !bytes.Contains(b, []byte("<svg")) || strings.TrimSpace(stdout) != want {
		t.Fatalf("default output: %v, stdout %q", err, stdout)
	}

	for _, args := range [][]string{{"plot", run, "-o", "x.txt"}, {"plot", filepath.Join(run, "nothing")}} {
		var ue usageError
		if _, _, err := execDrmas(t, args...); !errors.As(err, &ue) {
			t.Errorf("%v: err = %v, want bad input", args, err)
		}
	}
}
