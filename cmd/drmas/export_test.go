package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
	"github.com/drmas/drmas/pkg/torch"
)

// toyAdapterDir writes a PEFT adapter folder for p's model (every projection, embed_tokens and
// lm_head) whose B matrices (embed_tokens: A) are random (a new adapter's are zero, which would
// change nothing).
func toyAdapterDir(t *testing.T, p *policy.Policy) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "solver")
	a := policytest.Adapter(t, p.Model, dir, "solver", policy.LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{arch.LoRAAllLinear, "embed_tokens", "lm_head"}}, 5, 0.5)
	if err := torch.Do(func() error { a.Free(); return nil }); err != nil {
		t.Fatal(err)
	}
	return dir
}

// drmas export merges an adapter into its base: the merged folder generates (greedy) exactly the
// ids that drmas generate --adapter gives on the base, with the same log-probs, and other ids than the
// base alone. --out is never overwritten.
func TestExportMergedGeneratesAsTheAdapter(t *testing.T) {
	base, p := toyModelDir(t)
	adapter := toyAdapterDir(t, p)
	out := filepath.Join(t.TempDir(), "merged")
	if _, stderr, err := execDrmas(t, "export", "--model", base, "--adapter", adapter, "--out", out); err != nil {
		t.Fatalf("export: %v\n%s", err, stderr)
	}
	if policy.IsAdapterDir(out) {
		t.Fatal("the merged folder is an adapter folder")
	}
	// The toy base ties lm_head to the embeddings; an adapter of both sides merges into an untied model.
	var cfg struct {
		Tie *bool `json:"tie_word_embeddings"`
	}
	if data, err := os.ReadFile(filepath.Join(out, "config.json")); err != nil || json.Unmarshal(data, &cfg) != nil || cfg.Tie == nil || *cfg.Tie {
		t.Fatalf("merged config.json: tie_word_embeddings %v (err %v), want false", cfg.Tie, err)
	}
	gen := func(args ...string) generateResult {
		t.Helper()
		stdout, stderr, err := execDrmas(t, append([]string{"generate", "--prompt-ids", "60,97,110,115,62", "--temperature", "0",
			"--max-new-tokens", "12", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("generate %v: %v\n%s", args, err, stderr)
		}
		var r generateResult
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	viaAdapter := gen("--model", base, "--adapter", adapter)
	merged := gen("--model", out)
	plain := gen("--model", base)
	if !slices.Equal(merged.ResponseIDs, viaAdapter.ResponseIDs) {
		t.Fatalf("merged %v, adapter on the base %v", merged.ResponseIDs, viaAdapter.ResponseIDs)
	}
	for i := range merged.LogProbs {
		if d := merged.LogProbs[i] - viaAdapter.LogProbs[i]; d > 1e-4 || d < -1e-4 {
			t.Fatalf("token %d: log-prob %g merged, %g through the adapter", i, merged.LogProbs[i], viaAdapter.LogProbs[i])
		}
	}
	if slices.Equal(plain.ResponseIDs, viaAdapter.ResponseIDs) {
		t.Fatalf("the adapter generates what the base does (%v): the test shows nothing", plain.ResponseIDs)
	}
	// A folder with files is never overwritten.
	before, _ := os.ReadFile(filepath.Join(out, "config.json"))
	_, _, err := execDrmas(t, "export", "--model", base, "--adapter", adapter, "--out", out)
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("export onto a full folder: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(out, "config.json")); string(after) != string(before) {
		t.Fatal("export changed a folder it refused")
	}
}

// drmas export never writes a model with NaN or infinite weights (before: a NaN adapter merged into
// a NaN model, written with exit 0): a NaN adapter is refused when it loads, and a base with an
// infinite weight when the merged weights are checked; nothing is written either way.
func TestExportRefusesNonFiniteWeights(t *testing.T) {
	base, p := toyModelDir(t)
	nanAdapter := filepath.Join(t.TempDir(), "nan")
	a := policytest.Adapter(t, p.Model, "", "nan", policy.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{arch.LoRAAllLinear}}, 5, 0.5)
	if err := torch.Do(func() error {
		if err := torch.NoGrad(func() error {
			a.Parameters()[0].T.MustFill_(ts.FloatScalar(math.NaN()))
			return nil
		}); err != nil {
			return err
		}
		return a.Save(nanAdapter)
	}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "merged")
	_, _, err := execDrmas(t, "export", "--model", base, "--adapter", nanAdapter, "--out", out)
	if err == nil || !strings.Contains(err.Error(), "NaN") || !strings.Contains(err.Error(), nanAdapter) {
		t.Errorf("export of a NaN adapter: %v, want an error naming NaN and the adapter", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("export of a NaN adapter wrote --out")
	}

	infBase := t.TempDir()
	if err := torch.Do(func() error {
		if err := torch.NoGrad(func() error {
			p.Model.Parameters()[1].T.MustFill_(ts.FloatScalar(math.Inf(1)))
			return nil
		}); err != nil {
			return err
		}
		return p.Save(infBase)
	}); err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(t.TempDir(), "merged")
	_, _, err = execDrmas(t, "export", "--model", infBase, "--adapter", toyAdapterDir(t, p), "--out", out)
	if err == nil || !strings.Contains(err.Error(), "NaN or infinite") || !strings.Contains(err.Error(), "merged weight") {
		t.Errorf("export onto a base with an infinite weight: %v, want an error naming the merged weight", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("export onto a base with an infinite weight wrote --out")
	}
}
