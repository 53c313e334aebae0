package policy

import (
	"context"
	"errors"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
)

// A job that arrives while others decode starts before they end, takes no more than maxRows slots,
// and gets the tokens it gets alone; a bad job fails alone.
func TestGenerateJobsJoinRunningBatch(t *testing.T) {
	m := randomModel(t, arch.Qwen2, 300, gotch.Double, 0.3, 4)
	p := charPolicy(t, m)
	p.StopIDs = nil
	ps, ss := continuousRows()
	ref, err := p.GenerateIDs(context.Background(), ps, ss)
	if err != nil {
		t.Fatal(err)
	}
	var log []string // "start i" at a job's first token, "end i" at its Done
	got := make([]llm.Completion, len(ps))
	var badErr error
	job := func(i int) *Job {
		first := true
		return &Job{Prompt: ps[i], Sampling: ss[i], Opt: RowOptions{OnToken: func(Token) {
			if first {
				log = append(log, "start", string(rune('0'+i)))
				first = false
			}
		}}, Done: func(c llm.Completion, err error) {
			if err != nil {
				t.Errorf("job %d: %v", i, err)
			}
			got[i] = c
			log = append(log, "end", string(rune('0'+i)))
		}}
	}
	// Job 0 (14 tokens) starts alone; the bad job and jobs 1… arrive one per step after it.
	queue := []*Job{job(0), nil, {Prompt: []int{9999}, Sampling: greedy(3), Done: func(_ llm.Completion, err error) { badErr = err }}}
	for i := 1; i < len(ps); i++ {
		queue = append(queue, job(i))
	}
	next := func() *Job {
		if len(queue) == 0 {
			return nil
		}
		j := queue[0]
		queue = queue[1:]
		return j
	}
	if err := p.GenerateJobs(context.Background(), 3, next); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(badErr, llm.ErrBadRequest) {
		t.Fatalf("bad job: %v, want a bad request", badErr)
	}
	if start1 := indexPair(log, "start", "1"); start1 < 0 || indexPair(log, "end", "0") < start1 {
		t.Fatalf("job 1 did not start while job 0 ran: %v", log)
	}
	inFlight, most := 0, 0
	for i := 0; i < len(log); i += 2 {
		if log[i] == "start" {
			inFlight++
		} else {
			inFlight--
		}
		most = max(most, inFlight)
	}
	if most != 3 {
		t.Fatalf("%d jobs in flight at most, want 3: %v", most, log)
	}
	for i := range ps {
		sameCompletion(t, i, ref[i], got[i])
	}
}

// indexPair is the index of the pair (a, b) in log, or -1.
func indexPair(log []string, a, b string) int {
	for i := 0; i+1 < len(log); i += 2 {
		if log[i] == a && log[i+1] == b {
			return i
		}
	}
	return -1
}
