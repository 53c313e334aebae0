package serve

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// A request that arrives while a batch decodes starts before that batch ends (continuous batching)
// and gets the tokens it gets alone; with static batching it waits for the batch's end.
func TestRequestJoinsRunningBatch(t *testing.T) {
	for _, static := range []bool{false, true} {
		name := map[bool]string{false: "continuous", true: "static"}[static]
		t.Run(name, func(t *testing.T) {
			p := loadToy(t)
			p.StopIDs = nil // every row runs to its max_new_tokens
			s, err := New(p, toyDir, Options{MaxBatch: 8, Static: static})
			if err != nil {
				t.Fatal(err)
			}
			url := listen(t, s)
			short := map[string]any{"input_ids": []int{60, 97, 110}, "sampling_params": map[string]any{"max_new_tokens": 4, "sampling_seed": 3, "temperature": 1}}
			var alone genReply
			if code := post(t, url+"/generate", short, &alone); code != 200 {
				t.Fatalf("HTTP %d", code)
			}
			long := map[string]any{"input_ids": []int{60, 98}, "sampling_params": map[string]any{"max_new_tokens": 900, "sampling_seed": 1}}
			var wg sync.WaitGroup
			var longDone, shortDone time.Time
			var joined genReply
			wg.Add(1)
			go func() {
				defer wg.Done()
				var r genReply
				if code := post(t, url+"/generate", long, &r); code != 200 || len(r.OutputIDs) != 900 {
					t.Errorf("long request: HTTP %d, %d tokens", code, len(r.OutputIDs))
				}
				longDone = time.Now()
			}()
			// The long request is decoding once tokens flow.
			for base := s.tokens.Load(); s.tokens.Load() < base+20; {
				time.Sleep(time.Millisecond)
			}
			if code := post(t, url+"/generate", short, &joined); code != 200 {
				t.Fatalf("HTTP %d", code)
			}
			shortDone = time.Now()
			wg.Wait()
			if !slices.Equal(joined.OutputIDs, alone.OutputIDs) {
				t.Fatalf("short request: %v joining a batch, %v alone", joined.OutputIDs, alone.OutputIDs)
			}
			if before := shortDone.Before(longDone); before == static {
				t.Fatalf("%s batching: the short request ended before the long one: %v, want %v", name, before, !static)
			}
		})
	}
}
