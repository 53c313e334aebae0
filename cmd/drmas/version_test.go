package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/dist/c10d"
)

// version reports the data-parallel backends the build has: Gloo always, NCCL when set-up built it.
func TestVersionReportsBackends(t *testing.T) {
	out, _, err := execDrmas(t, "version", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		LibTorch string   `json:"libtorch"`
		Backends []string `json:"dist_backends"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("version --json: %v\n%s", err, out)
	}
	want := []string{"gloo"}
	if c10d.NCCLAvailable() {
		want = append(want, "nccl")
	}
	if v.LibTorch == "" || !slices.Equal(v.Backends, want) {
		t.Fatalf("version --json: libtorch %q, backends %v, want %v", v.LibTorch, v.Backends, want)
	}
	text, _, err := execDrmas(t, "version")
	if err != nil || !strings.Contains(text, "data-parallel (c10d): "+strings.Join(want, ", ")+"\n") {
		t.Fatalf("version: %v\n%s", err, text)
	}
}
