package main

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestTrainDryRun(t *testing.T) {
	out, _, err := execDrmas(t, "train", "--config", "../../configs/toy-search.yaml", "--dry-run", "--set", "run.steps=7")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"steps: 7", "type: search", "normalization:", "preset: drmas"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
}

// Bad configs are one-line errors naming the problem, with exit code 2 (a usage error).
func TestTrainBadConfigExit2(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, err := os.ReadFile("../../configs/toy-math.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wrongType := regexp.MustCompile(`warmup: \{steps: \d+`).ReplaceAllString(string(good), "warmup: {steps: many")
	if wrongType == string(good) {
		t.Fatal("configs/toy-math.yaml has no `warmup: {steps: N` to break")
	}
	cases := map[string]struct{ path, want string }{
		"missing file":   {filepath.Join(dir, "none.yaml"), "none.yaml"},
		"unknown key":    {write("unknown.yaml", string(good)+"\nbogus_section: 1\n"), "unknown key bogus_section"},
		"wrong type":     {write("type.yaml", wrongType), "warmup.steps"},
		"duplicate key":  {write("dup.yaml", string(good)+"\nwarmup: {steps: 1}\n"), "already defined"},
		"malformed yaml": {write("bad.yaml", "run: [\n"), "malformed YAML"},
	}
	for name, c := range cases {
		_, _, err := execDrmas(t, "train", "--config", c.path, "--dry-run")
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%s: err = %v, want a usage error (exit 2)", name, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("%s: error %q should be one line containing %q", name, msg, c.want)
		}
	}
}
