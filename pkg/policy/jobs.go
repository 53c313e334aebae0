package policy

import (
	"context"
	"fmt"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/torch"
)

// Job is one generation that GenerateJobs runs.
type Job struct {
	Prompt   []int
	Sampling llm.Sampling
	Opt      RowOptions
	// Done is handed the job's completion, or why it did not complete, exactly once, on the torch
	// thread: it must return at once and must not enter torch.Do.
	Done func(llm.Completion, error)
	// adapter, when set, is the row's adapter (a Concurrent generator's: the policy's own, whoever
	// leads the batch); else Opt.Adapter names it, or the batch's policy's.
	adapter *Adapter
}

// GenerateJobs generates jobs as they come, with continuous batching (maxRows in flight at most, 0:
// no limit, and the policy's KVTokens): next is asked for a job whenever a row could start, between
// decoding steps; it must not block, and returns nil when none waits. GenerateJobs returns once no
// row is in flight and next has none. A job that is not valid (llm.ErrBadRequest) fails alone, at
// once; an error of the batch (or ctx's end) fails every job in flight and is returned. It enters
// torch.Do itself.
func (p *Policy) GenerateJobs(ctx context.Context, maxRows int, next func() *Job) error {
	src := &jobFeed{p: p, next: next}
	var e *engine
	err := torch.Do(func() error {
		return torch.NoGrad(func() error {
			scope := torch.NewScope()
			defer scope.Close()
			e = p.newEngine(ctx, p.decodingModel(p.Model.Base()))
			e.maxRows = maxRows
			e.onDone = func(r *row) { r.end(p.completion(r), nil) }
			return e.run(src)
		})
	})
	torch.ReleaseMemory()
	if err != nil {
		var failed []*row
		if e != nil {
			failed = e.failed
		}
		for _, r := range append(failed, src.buf...) {
			r.end(llm.Completion{}, err)
		}
	}
	return err
}

// jobFeed is the source of GenerateJobs: jobs turned into rows as the engine asks for them.
type jobFeed struct {
	p    *Policy
	next func() *Job
	buf  []*row
}

func (f *jobFeed) peek() *row {
	for len(f.buf) == 0 {
		j := f.next()
		if j == nil {
			return nil
		}
		r, err := f.p.jobRow(j)
		if err != nil {
			j.Done(llm.Completion{}, err)
			continue
		}
		f.buf = append(f.buf, r)
	}
	return f.buf[0]
}

func (f *jobFeed) pop() { f.buf = f.buf[1:] }

// jobRow is j's row, or why j cannot run.
func (p *Policy) jobRow(j *Job) (*row, error) {
	if err := p.checkRequest(j.Prompt, j.Sampling); err != nil {
		return nil, fmt.Errorf("policy %s: %w: %w", p.ID, llm.ErrBadRequest, err)
	}
	if n := j.Opt.TopLogProbs; n < 0 || n > MaxTopLogProbs {
		return nil, fmt.Errorf("policy %s: %w: top log-probs %d: want 0–%d", p.ID, llm.ErrBadRequest, n, MaxTopLogProbs)
	}
	if err := j.Opt.checkRoutes(p.Model, len(j.Prompt), j.Sampling.MaxNewTokens); err != nil {
		return nil, fmt.Errorf("policy %s: %w: %w", p.ID, llm.ErrBadRequest, err)
	}
	a := p.Model.Adapter()
	if j.adapter != nil {
		a = j.adapter
	} else if j.Opt.Adapter != "" {
		if a = p.LookupAdapter(j.Opt.Adapter); a == nil {
			return nil, fmt.Errorf("policy %s: %w: no adapter %q", p.ID, llm.ErrBadRequest, j.Opt.Adapter)
		}
	}
	return &row{prompt: j.Prompt, sampling: j.Sampling, opt: j.Opt, adapter: a, end: j.Done}, nil
}
