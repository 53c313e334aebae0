package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/drmas/drmas/pkg/llm"
)

// Concurrent returns the router as a generator whose concurrent Generate calls share continuous
// batches: a call's rows join the rows in flight at the next decoding step (GenerateJobs), each on
// its policy's adapter, the policies of one base in one batch (multi-LoRA). Callers that each ask
// for a few completions at once — a gateway's episodes, every one a client of its own — are
// decoded together. A row's tokens are what Generate would sample for its seed.
func (r Router) Concurrent() llm.Generator {
	out := llm.Router{}
	batchers := map[*Model]*batcher{}
	for id, p := range r {
		base := p.Model.Base()
		b := batchers[base]
		if b == nil {
			b = &batcher{lead: p}
			batchers[base] = b
		}
		if p.Model == base { // the base's own policy leads: its decoding layout is the one held
			b.lead = p
		}
		out[id] = &concurrentPolicy{p: p, b: b}
	}
	return out
}

// concurrentPolicy is one policy's requests sent to its base's batcher.
type concurrentPolicy struct {
	p *Policy
	b *batcher
}

// Generate encodes the requests (a raw Text, or messages through the chat template), fits them to
// the context as Generate does, and queues them; it returns when every one has completed.
func (c *concurrentPolicy) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	prompts := make([][]int, len(reqs))
	settings := make([]llm.Sampling, len(reqs))
	for i, r := range reqs {
		ids, err := c.p.encodeRequest(r)
		if err != nil {
			return nil, fmt.Errorf("request %d (agent %s): %w", i, r.Agent, err)
		}
		prompts[i], settings[i] = ids, r.Sampling
	}
	overlong := c.p.fitContext(reqs, prompts, settings)
	out := make([]llm.Completion, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	var jobs []*Job
	for i := range reqs {
		if overlong != nil && overlong[i] {
			out[i] = llm.Completion{PromptIDs: prompts[i], Finish: llm.FinishOverlong}
			continue
		}
		wg.Add(1)
		opt := RowOptions{Ctx: ctx}
		if c.p.Model.isMoE() {
			opt.Record = new(Routes)
		}
		jobs = append(jobs, &Job{Prompt: prompts[i], Sampling: settings[i], Opt: opt, adapter: c.p.Model.Adapter(),
			Done: func(comp llm.Completion, err error) { out[i], errs[i] = comp, err; wg.Done() }})
	}
	c.b.submit(jobs)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("policy %s: %w", c.p.ID, err)
	}
	return out, nil
}

// batcher feeds one base model's queued jobs to GenerateJobs, which runs while there are rows.
type batcher struct {
	lead *Policy

	mu      sync.Mutex
	queue   []*Job
	running bool
}

// submit queues jobs and starts the generation loop if none runs.
func (b *batcher) submit(jobs []*Job) {
	if len(jobs) == 0 {
		return
	}
	b.mu.Lock()
	b.queue = append(b.queue, jobs...)
	start := !b.running
	b.running = true
	b.mu.Unlock()
	if start {
		go b.loop()
	}
}

// loop runs continuous batches until the queue stays empty; a batch's error fails its rows (their
// callers see it), the loop goes on with the queue.
func (b *batcher) loop() {
	next := func() *Job {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.queue) == 0 {
			return nil
		}
		j := b.queue[0]
		b.queue = b.queue[1:]
		return j
	}
	for {
		_ = b.lead.GenerateJobs(context.Background(), b.lead.MaxBatch, next)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
}

// Concurrent is the policy alone as a generator whose concurrent calls share continuous batches
// (Router.Concurrent).
func (p *Policy) Concurrent() llm.Generator { return &concurrentPolicy{p: p, b: &batcher{lead: p}} }
