package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestBenchCommand(t *testing.T) {
	dir, _ := toyModelDir(t)
	out, _, err := execDrmas(t, "bench", "--model", dir, "--batch", "2", "--prompt-len", "4", "--response-len", "3", "--steps", "1", "--matmul-size", "128", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got benchOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	if got.Params == 0 || got.MatmulGFLOPS <= 0 || got.TrainMsPerStep <= 0 || got.GenTokensPerSec <= 0 ||
		got.TrainGFLOPS <= 0 || got.GenGFLOPS <= 0 || got.DecodeMsPerStep <= 0 || got.Batch != 2 || got.ModelType != "qwen2" {
		t.Fatalf("bench --json = %+v", got)
	}
	out, _, err = execDrmas(t, "bench", "--model", dir, "--batch", "1", "--prompt-len", "2", "--response-len", "2", "--steps", "1", "--matmul-size", "128")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"matmul", "train step", "ms/step", "tokens/s", "GFLOP/s"} {
		if !strings.Contains(out, want) {
			t.Fatalf("bench table lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchCommandBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch", "2"}, "exactly one of --model and --preset"},
		{[]string{"--preset", "huge"}, `preset "huge"`},
		{[]string{"--preset", "tiny", "--batch", "0"}, "--batch 0"},
		{[]string{"--model", t.TempDir()}, "config.json"},
	} {
		_, _, err := execDrmas(t, append([]string{"bench"}, tc.args...)...)
		var ue usageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: err = %v, want a usage error mentioning %q", tc.args, err, tc.want)
		}
	}
}
