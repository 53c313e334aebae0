package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/bench"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// go test ./pkg/serve -run '^$' -bench MixedLoad -benchtime 1x   (docs/serve.md has the figures)

// BenchmarkServeMixedLoad: 200 concurrent /generate requests on loopback, 32-token prompts and
// response lengths drawn from a log-normal (median 32, σ 1, clipped to [4, 256]; no stop tokens, so
// each request generates exactly its length), against the tiny preset served with static and with
// continuous batching (64 rows in flight). Reports generated tokens/s and the p50 and p99 latency
// of a request (sent to answered).
func BenchmarkServeMixedLoad(b *testing.B) {
	const n = 200
	lengths := bench.GenLengths{Median: 32, Sigma: 1, Min: 4, Max: 256}.Draw(n, 1)
	for _, static := range []bool{true, false} {
		b.Run(map[bool]string{true: "static", false: "continuous"}[static], func(b *testing.B) {
			url := loadServer(b, static)
			for range b.N {
				tokens, lat := mixedLoad(b, url, lengths)
				slices.Sort(lat)
				b.ReportMetric(tokens, "tokens/s")
				b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Milliseconds()), "p99-ms")
			}
		})
	}
}

// loadServer serves a random tiny-preset model (the toy tokenizer, no stop tokens) on loopback.
func loadServer(b *testing.B, static bool) string {
	toy := loadToy(b)
	c, err := bench.Preset("tiny")
	if err != nil {
		b.Fatal(err)
	}
	c.VocabSize = toy.Tok.VocabSize()
	var p *policy.Policy
	if err := torch.Do(func() error {
		m, err := policy.NewRandom(c, gotch.CPU, gotch.Float, 1)
		if err == nil {
			p, err = policy.NewPolicy("tiny", m, toy.Tok, toy.Chat)
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	p.StopIDs = nil
	s, err := New(p, "tiny", Options{MaxBatch: 64, Static: static})
	if err != nil {
		b.Fatal(err)
	}
	return listenB(b, s)
}

// mixedLoad sends one request per length at once and returns the generated tokens per second and
// each request's latency.
func mixedLoad(b *testing.B, url string, lengths []int) (float64, []time.Duration) {
	lat := make([]time.Duration, len(lengths))
	errs := make(chan error, len(lengths))
	var wg sync.WaitGroup
	began := time.Now()
	total := 0
	for i, n := range lengths {
		total += n
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt := make([]int, 32)
			for j := range prompt {
				prompt[j] = 40 + (i*7+j)%80
			}
			body := map[string]any{"input_ids": prompt, "sampling_params": map[string]any{"max_new_tokens": n, "sampling_seed": i, "temperature": 1}}
			t0 := time.Now()
			var r genReply
			if code := postB(url+"/generate", body, &r); code != 200 || len(r.OutputIDs) != n {
				errs <- fmt.Errorf("request %d: HTTP %d, %d tokens of %d", i, code, len(r.OutputIDs), n)
			}
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(total) / time.Since(began).Seconds(), lat
}

// postB posts body as JSON and decodes the reply into out; it returns the HTTP status (0 when the
// request failed).
func postB(url string, body, out any) int {
	bs, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(bs))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if json.NewDecoder(resp.Body).Decode(out) != nil {
		return 0
	}
	return resp.StatusCode
}
