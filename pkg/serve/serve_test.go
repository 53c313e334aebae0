package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

const toyDir = "../policy/testdata/toy"

func toyServer(t *testing.T, opt Options) (*Server, *httptest.Server) {
	t.Helper()
	var p *policy.Policy
	if err := torch.Do(func() error {
		var err error
		p, err = policy.LoadPolicy("toy", toyDir, gotch.CPU, gotch.Float)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s := New(p, toyDir, opt)
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
	s, hs := toyServer(t, Options{Window: 200 * time.Millisecond, MaxBatch: 16})
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
	if _, err := s.toSampling(samplingParams{StopTokenIDs: []int{12345}}, 4); err == nil {
		t.Error("a stop token the model does not stop at was accepted")
	}
}
