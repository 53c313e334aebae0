package policy

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
)

// continuousRows are prompts of growing length (each newcomer's prompt is longer than the cache's
// columns when it joins, so the cache is shifted) with long and short responses, sampling and greedy.
func continuousRows() ([][]int, []llm.Sampling) {
	var ps [][]int
	var ss []llm.Sampling
	lengths := []int{14, 2, 9, 1, 12, 5, 3, 16}
	for i, n := range lengths {
		var p []int
		for j := 0; j < 2+3*i; j++ {
			p = append(p, 40+(7*i+j)%60)
		}
		ps = append(ps, p)
		s := llm.Sampling{Temperature: 1, TopK: 30, MaxNewTokens: n, Seed: int64(100 + i)}
		if i%3 == 2 {
			s = llm.Sampling{MaxNewTokens: n}
		}
		ss = append(ss, s)
	}
	return ps, ss
}

// traced runs f with traceEngine recording the layouts, and returns them.
func traced(t *testing.T, f func()) (events []string, peak int) {
	t.Cleanup(func() { traceEngine = nil })
	traceEngine = func(event string, slots, columns int) {
		events = append(events, event)
		peak = max(peak, slots*columns)
	}
	f()
	traceEngine = nil
	return events, peak
}

// With continuous batching (two rows in flight, newcomers taking finished rows' slots, the cache
// shifted and compacted, the live row decoded alone once its neighbour has finished), each row gets
// the tokens it gets alone, with the same log-probs, whether decoding attends row by row
// (attendRows), as a batch from the oldest row's columns (attendFrom), or either as each step's
// columns make it cheaper (a mid cost); in float64 (libtorch's ops row by row) and in float32 (the
// CPU kernel, which always attends row by row), within float32's noise there. A mixture of experts
// (Qwen3-MoE) too: its experts run the live rows' tokens alone.
func TestContinuousBatchMatchesAlone(t *testing.T) {
	defer func(c int64) { rowAttendCost = c }(rowAttendCost)
	for _, tc := range []struct {
		family string
		dtype  gotch.DType
		cost   int64
	}{{arch.Qwen2, gotch.Double, 0}, {arch.Qwen2, gotch.Double, 6}, {arch.Qwen2, gotch.Double, 1 << 40},
		{arch.Mistral, gotch.Double, 0}, {arch.Mistral, gotch.Double, 6}, {arch.Mistral, gotch.Double, 1 << 40},
		{arch.Qwen2, gotch.Float, 0}, {arch.Mistral, gotch.Float, 0},
		{arch.Qwen3MoE, gotch.Double, 0}, {arch.Qwen3MoE, gotch.Double, 1 << 40}, {arch.Qwen3MoE, gotch.Float, 0}} {
		rowAttendCost = tc.cost
		family := tc.family
		t.Run(fmt.Sprintf("%s-%v-cost-%d", family, tc.dtype, tc.cost), func(t *testing.T) {
			m := randomModel(t, family, 300, tc.dtype, 0.3, 5)
			p := charPolicy(t, m)
			p.StopIDs = nil
			ps, ss := continuousRows()
			p.MaxBatch = 2
			var got []llm.Completion
			events, _ := traced(t, func() {
				var err error
				if got, err = p.GenerateIDs(context.Background(), ps, ss); err != nil {
					t.Fatal(err)
				}
			})
			if joins := count(events, "join"); joins < 3 {
				t.Fatalf("%d joins (%v): rows did not take finished rows' slots", joins, events)
			}
			if count(events, "relayout") == 0 {
				t.Fatalf("no relayout in %v", events)
			}
			if count(events, "live") == 0 {
				t.Fatalf("no step decoded the live rows alone: %v", events)
			}
			p.MaxBatch = 0
			tol := 1e-6
			if tc.dtype == gotch.Float {
				tol = 1e-4
			}
			for i := range ps {
				alone, err := p.GenerateIDs(context.Background(), ps[i:i+1], ss[i:i+1])
				if err != nil {
					t.Fatal(err)
				}
				sameCompletionWithin(t, i, alone[0], got[i], tol)
			}
		})
	}
}

func count(events []string, e string) int {
	n := 0
	for _, x := range events {
		if x == e {
			n++
		}
	}
	return n
}

func sameCompletion(t *testing.T, i int, want, got llm.Completion) {
	t.Helper()
	sameCompletionWithin(t, i, want, got, 1e-6)
}

// sameCompletionWithin is sameCompletion with log-probs within tol.
func sameCompletionWithin(t *testing.T, i int, want, got llm.Completion, tol float64) {
	t.Helper()
	if !slices.Equal(want.ResponseIDs, got.ResponseIDs) || want.Finish != got.Finish {
		t.Fatalf("row %d: alone %v (%s), continuous %v (%s)", i, want.ResponseIDs, want.Finish, got.ResponseIDs, got.Finish)
	}
	for j := range want.LogProbs {
		if math.Abs(float64(want.LogProbs[j]-got.LogProbs[j])) > tol {
			t.Fatalf("row %d token %d: log-prob alone %.8f, continuous %.8f", i, j, want.LogProbs[j], got.LogProbs[j])
		}
	}
}

// A KV budget holds the cache (slots × columns) within it: rows wait for room, and still get their
// own tokens. Static batching gives the same completions.
func TestKVBudget(t *testing.T) {
	m := randomModel(t, arch.Llama, 300, gotch.Double, 0.3, 9)
	p := charPolicy(t, m)
	p.StopIDs = nil
	ps, ss := continuousRows()
	ref, err := p.GenerateIDs(context.Background(), ps, ss)
	if err != nil {
		t.Fatal(err)
	}
	p.MaxBatch, p.KVTokens = 4, 60
	var got []llm.Completion
	_, peak := traced(t, func() {
		if got, err = p.GenerateIDs(context.Background(), ps, ss); err != nil {
			t.Fatal(err)
		}
	})
	// One row always runs: the largest alone needs its prompt and max_new_tokens.
	limit := int(p.KVTokens)
	for i := range ps {
		limit = max(limit, len(ps[i])+ss[i].MaxNewTokens-1)
	}
	if peak > limit {
		t.Fatalf("cache of %d positions, budget %d", peak, limit)
	}
	p.KVTokens, p.StaticBatching = 0, true
	static, err := p.GenerateIDs(context.Background(), ps, ss)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		sameCompletion(t, i, ref[i], got[i])
		sameCompletion(t, i, ref[i], static[i])
	}
}

// The cache continuous batching holds stays within what the memory plan counts for it (pkg/plan:
// rollout.max_batch slots of at most twice the longest row's columns, prompt + max_new_tokens), and
// can need more than one row's columns a slot: a row that joins with a long response while the oldest
// row is near its end makes the cache span both.
func TestContinuousCacheWithinPlan(t *testing.T) {
	m := randomModel(t, arch.Llama, 300, gotch.Double, 0.3, 9)
	p := charPolicy(t, m)
	p.StopIDs = nil
	prompt := func(n int) []int {
		var out []int
		for j := range n {
			out = append(out, 40+j%60)
		}
		return out
	}
	for _, c := range []struct {
		rows   int
		ps     [][]int
		ss     []llm.Sampling
		beyond bool // the cache must exceed rows × T
	}{
		// A (2 + 40) runs; B ends when A is 30 tokens in; C (2 + 40) takes B's slot: 70 columns
		{2, [][]int{prompt(2), prompt(2), prompt(2)}, []llm.Sampling{{MaxNewTokens: 40}, {MaxNewTokens: 30}, {MaxNewTokens: 40}}, true},
		{2, nil, nil, false}, {3, nil, nil, false}, {5, nil, nil, false},
	} {
		ps, ss := c.ps, c.ss
		if ps == nil {
			ps, ss = continuousRows()
		}
		T := 0
		for i := range ps {
			T = max(T, len(ps[i])+ss[i].MaxNewTokens)
		}
		p.MaxBatch = c.rows
		events, peak := traced(t, func() {
			if _, err := p.GenerateIDs(context.Background(), ps, ss); err != nil {
				t.Fatal(err)
			}
		})
		if count(events, "join") == 0 {
			t.Fatalf("max_batch %d: no join in %v", c.rows, events)
		}
		if peak > c.rows*T*2 {
			t.Errorf("max_batch %d: a cache of %d positions, the plan counts %d (2 × %d columns a slot)", c.rows, peak, c.rows*2*T, T)
		}
		if c.beyond && peak <= c.rows*T {
			t.Errorf("max_batch %d: a cache of %d positions, not beyond one row's %d columns a slot", c.rows, peak, T)
		}
	}
}
