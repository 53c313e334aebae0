package serve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/bench"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// go test ./pkg/serve -run '^$' -bench Serve -benchtime 1x   (docs/serve.md has the figures)

// streamChat posts a streamed chat and returns when its first content chunk and its [DONE] came,
// and how many chunks carried content.
func streamChat(url string, body map[string]any) (first, last time.Duration, chunks int, err error) {
	body["stream"] = true
	b, _ := json.Marshal(body)
	began := time.Now()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, 0, 0, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			return first, time.Since(began), chunks, nil
		}
		if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			if chunks == 0 {
				first = time.Since(began)
			}
			chunks++
		}
	}
	return 0, 0, 0, fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
}

// benchServer serves a random model of the policy preset (the toy tokenizer and template).
func benchServer(b *testing.B, preset string) (*Server, string) {
	toy := loadToy(&testing.T{})
	var p *policy.Policy
	if preset == "toy" {
		p = toy
	} else {
		c, err := bench.Preset(preset)
		if err != nil {
			b.Fatal(err)
		}
		c.VocabSize = toy.Tok.VocabSize()
		if err := torch.Do(func() error {
			m, err := policy.NewRandom(c, gotch.CPU, gotch.Float, 1)
			if err == nil {
				p, err = policy.NewPolicy(preset, m, toy.Tok, toy.Chat)
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	s, err := New(p, preset, Options{})
	if err != nil {
		b.Fatal(err)
	}
	return s, listenB(b, s)
}

// BenchmarkServeStreaming: time to the first chunk of a streamed 64-token chat against the
// latency of the same request in one reply, and 200 concurrent streamed chats of 64 tokens.
func BenchmarkServeStreaming(b *testing.B) {
	for _, preset := range []string{"toy", "tiny"} {
		b.Run(preset, func(b *testing.B) {
			_, url := benchServer(b, preset)
			// A seed whose answer runs the full 64 tokens.
			seed := -1
			for s := 0; s < 50 && seed < 0; s++ {
				code, r := callB(url, map[string]any{"messages": chatMsgs, "max_tokens": 64, "seed": s, "temperature": 1})
				if code == 200 && int(r["usage"].(map[string]any)["completion_tokens"].(float64)) == 64 {
					seed = s
				}
			}
			if seed < 0 {
				b.Fatal("no seed gives 64 tokens")
			}
			ask := func() map[string]any {
				return map[string]any{"messages": chatMsgs, "max_tokens": 64, "seed": seed, "temperature": 1}
			}
			var whole, firsts, lasts []time.Duration
			for range b.N * 7 {
				began := time.Now()
				if code, _ := callB(url, ask()); code != 200 {
					b.Fatal(code)
				}
				whole = append(whole, time.Since(began))
				first, last, chunks, err := streamChat(url, ask())
				if err != nil || chunks < 2 {
					b.Fatalf("stream: %v, %d chunks", err, chunks)
				}
				firsts, lasts = append(firsts, first), append(lasts, last)
			}
			med := func(d []time.Duration) float64 { slices.Sort(d); return float64(d[len(d)/2].Microseconds()) / 1000 }
			b.ReportMetric(med(whole), "ms/reply")
			b.ReportMetric(med(firsts), "ms-to-first-chunk")
			b.ReportMetric(med(lasts), "ms/stream")

			const n = 200
			var wg sync.WaitGroup
			errs := make(chan error, n)
			began := time.Now()
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, _, _, err := streamChat(url, map[string]any{"messages": chatMsgs, "max_tokens": 64, "seed": i, "temperature": 1}); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			b.ReportMetric(n/time.Since(began).Seconds(), "streams/s@200")
		})
	}
}

func callB(url string, body map[string]any) (int, map[string]any) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}
