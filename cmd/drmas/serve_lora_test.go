package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
)

// `drmas serve --lora NAME=DIR` serves the adapter from start-up: listed with the base as parent,
// generating what the policy API generates on it; bad --lora flags are refused before loading.
func TestServeLoRAFlags(t *testing.T) {
	dir, p := toyModelDir(t)
	ad := filepath.Join(t.TempDir(), "solver")
	a := policytest.Adapter(t, p.Model.Base(), ad, filepath.Base(ad), policy.LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{arch.LoRAAllLinear}}, 5, 1)
	s := startServe(t, dir, "--name", "base", "--lora", "solver="+ad, "--max-loras", "1")
	r, err := http.Get(s.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var resp map[string]any
	err = json.NewDecoder(r.Body).Decode(&resp)
	r.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range resp["data"].([]any) {
		mm := m.(map[string]any)
		listed = append(listed, fmt.Sprintf("%v<%v", mm["id"], mm["parent"]))
	}
	if !slices.Equal(listed, []string{"base<<nil>", "solver<base"}) {
		t.Errorf("/v1/models lists %v", listed)
	}
	ap, err := policy.NewAdapterPolicy("ref", p, a)
	if err != nil {
		t.Fatal(err)
	}
	differs := false
	for _, prompt := range [][]int{{3, 4, 5, 6}, {7, 8, 9}} {
		want, err := ap.GenerateIDs(context.Background(), [][]int{prompt}, []llm.Sampling{{MaxNewTokens: 8}})
		if err != nil {
			t.Fatal(err)
		}
		base, err := p.GenerateIDs(context.Background(), [][]int{prompt}, []llm.Sampling{{MaxNewTokens: 8}})
		if err != nil {
			t.Fatal(err)
		}
		differs = differs || !slices.Equal(base[0].ResponseIDs, want[0].ResponseIDs)
		code, out := postJSON(t, s.URL+"/v1/completions", map[string]any{"model": "solver", "prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": true})
		if code != 200 {
			t.Fatalf("completion on the adapter: %d %v", code, out)
		}
		if got := fmt.Sprint(out["choices"].([]any)[0].(map[string]any)["token_ids"]); got != fmt.Sprint(want[0].ResponseIDs) {
			t.Errorf("prompt %v on the adapter: served %s, policy API %v", prompt, got, want[0].ResponseIDs)
		}
	}
	if !differs {
		t.Error("the adapter generates what the base generates: the test proves nothing")
	}
	for _, bad := range [][]string{
		{"--lora", "solver"},
		{"--lora", "a=" + ad, "--lora", "b=" + ad, "--max-loras", "1"},
		{"--lora", "a=" + ad, "--lora", "a=" + ad},
		{"--lora", "a=" + dir},
	} {
		_, _, err := execDrmas(t, append([]string{"serve", "--model", dir, "--port", "0"}, bad...)...)
		if err == nil || !strings.Contains(err.Error(), "lora") {
			t.Errorf("drmas serve %v: %v, want a refusal naming --lora", bad, err)
		}
	}
}
