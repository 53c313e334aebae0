package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/policy/policytest"
)

const toyDir = "../policy/testdata/toy"

func toyServer(t *testing.T, opt Options) (*Server, *httptest.Server) {
	t.Helper()
	p := policytest.Load(t, toyDir)
	s, err := New(p, toyDir, opt)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.run(ctx); close(done) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	return s, hs
}

func post(t *testing.T, url string, body any, out any) int {
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Error(err)
	}
	return resp.StatusCode
}

type genReply struct {
	OutputIDs []int `json:"output_ids"`
	MetaInfo  struct {
		WeightVersion string `json:"weight_version"`
	} `json:"meta_info"`
}

// Concurrent requests are batched (a generous window gathers them all) and each still gets the
// tokens its seed gives alone; a reload queued among them waits for the batch before it and the
// requests after it see the new version.
func TestBatchesConcurrentRequestsAndReloadsBetweenThem(t *testing.T) {
	s, hs := toyServer(t, Options{Window: 200 * time.Millisecond, MaxBatch: 16, WeightUpdates: true, WeightsRoot: toyDir})
	ask := func(seed int) map[string]any {
		return map[string]any{"input_ids": []int{60, 97, 110, 100 + seed%5}, "sampling_params": map[string]any{"max_new_tokens": 5, "sampling_seed": seed}}
	}
	alone := map[int][]int{}
	for seed := 0; seed < 6; seed++ {
		var r genReply
		if code := post(t, hs.URL+"/generate", ask(seed), &r); code != 200 {
			t.Fatalf("HTTP %d", code)
		}
		alone[seed] = r.OutputIDs
	}
	before := s.batches.Load()
	var wg sync.WaitGroup
	got := make([]genReply, 6)
	for seed := 0; seed < 6; seed++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			post(t, hs.URL+"/generate", ask(seed), &got[seed])
		}()
	}
	wg.Wait()
	if n := s.batches.Load() - before; n >= 6 {
		t.Errorf("6 concurrent requests took %d batches: not batched", n)
	}
	for seed := 0; seed < 6; seed++ {
		if fmt.Sprint(got[seed].OutputIDs) != fmt.Sprint(alone[seed]) {
			t.Errorf("seed %d: batched %v, alone %v", seed, got[seed].OutputIDs, alone[seed])
		}
	}

	var up map[string]any
	if code := post(t, hs.URL+"/update_weights_from_disk", map[string]any{"model_path": toyDir, "weight_version": "v7"}, &up); code != 200 || up["success"] != true {
		t.Fatalf("reload: %d %v", code, up)
	}
	var r genReply
	post(t, hs.URL+"/generate", ask(1), &r)
	if r.MetaInfo.WeightVersion != "v7" || fmt.Sprint(r.OutputIDs) != fmt.Sprint(alone[1]) {
		t.Fatalf("after reloading the same weights: version %q, ids %v (want v7, %v)", r.MetaInfo.WeightVersion, r.OutputIDs, alone[1])
	}
	if _, err := s.toSampling(samplingParams{commonParams: commonParams{StopTokenIDs: []int{12345}}}, 4); err == nil {
		t.Error("a stop token the model does not stop at was accepted")
	}
}

// A reload from a folder with the same weights' shapes but another config.json serves with the new
// configuration (before: it reported the new folder and kept the old rope_theta, rms_norm_eps and
// max_position_embeddings); another architecture is refused and the old model keeps serving.
func TestReloadTakesTheFolderConfig(t *testing.T) {
	dir := t.TempDir()
	s, hs := toyServer(t, Options{WeightUpdates: true, WeightsRoot: dir})
	for _, f := range []string{"model.safetensors", "tokenizer.json"} {
		data, err := os.ReadFile(filepath.Join(toyDir, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), data, 0o644)
	}
	cfg, err := os.ReadFile(filepath.Join(toyDir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(pairs ...string) {
		text := string(cfg)
		for i := 0; i < len(pairs); i += 2 {
			next := strings.Replace(text, pairs[i], pairs[i+1], 1)
			if next == text {
				t.Fatalf("config.json has no %s", pairs[i])
			}
			text = next
		}
		os.WriteFile(filepath.Join(dir, "config.json"), []byte(text), 0o644)
	}
	edit(`"rope_theta": 10000`, `"rope_theta": 500`, `"rms_norm_eps": 0.000001`, `"rms_norm_eps": 0.01`,
		`"max_position_embeddings": 1024`, `"max_position_embeddings": 64`)
	var up map[string]any
	if code := post(t, hs.URL+"/update_weights_from_disk", map[string]any{"model_path": dir}, &up); code != 200 || up["success"] != true {
		t.Fatalf("reload: %d %v", code, up)
	}
	if c := s.pol.Model.Config; c.RopeTheta != 500 || c.RMSNormEps != 0.01 || c.MaxPositionEmbeddings != 64 {
		t.Errorf("served config after reload: rope_theta %g, rms_norm_eps %g, max_position_embeddings %d; want 500, 0.01, 64",
			c.RopeTheta, c.RMSNormEps, c.MaxPositionEmbeddings)
	}
	edit(`"hidden_act": "silu"`, `"hidden_act": "gelu"`)
	up = nil
	if code := post(t, hs.URL+"/update_weights_from_disk", map[string]any{"model_path": dir}, &up); code == 200 && up["success"] == true {
		t.Errorf("a reload with another hidden_act was accepted: %v", up)
	} else if !strings.Contains(fmt.Sprint(up), "hidden_act") {
		t.Errorf("refusal %v does not name hidden_act", up)
	}
}
