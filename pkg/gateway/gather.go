package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/drmas/drmas/pkg/llm"
)

// Gathering. The episodes of a rollout call the endpoint one HTTP request at a time, each a little
// after the other; handed to the generator as they come, every call would start a batch of its own
// or join one already decoding, and the rollout would take as many decoding steps as the calls are
// spread, plus their length. The built-in orchestras hand each agent all its calls of a step at
// once. The gateway comes close to that without knowing the team: a call waits until every episode
// being played has a call waiting (a team in lockstep: one batch per step, as built in) or, at most,
// gatherWait after the first waiting call, and the waiting calls go to the generator together (whose
// continuous batching still lets later calls join).

// gatherWait bounds how long a call waits for the other episodes' calls.
const gatherWait = 10 * time.Millisecond

// gather collects one rollout's calls into shared Generate calls.
type gather struct {
	ctx context.Context // the rollout's: a batch serves many episodes
	gen llm.Generator
	clk *clock

	mu       sync.Mutex
	playing  int // episodes whose runner is playing them
	waiting  []*ask
	timer    *time.Timer
	batches  int // Generate calls made
	gathered int // calls they served
}

// ask is one call's requests waiting for their completions.
type ask struct {
	reqs []llm.Request
	done chan answerOf
}

type answerOf struct {
	comps []llm.Completion
	err   error
}

func newGather(ctx context.Context, gen llm.Generator, clk *clock) *gather {
	return &gather{ctx: ctx, gen: gen, clk: clk}
}

// begin and end count an episode being played.
func (g *gather) begin() {
	g.mu.Lock()
	g.playing++
	g.mu.Unlock()
}

func (g *gather) end() {
	g.mu.Lock()
	g.playing--
	batch := g.ready()
	g.mu.Unlock()
	g.send(batch)
}

// ready takes the waiting calls when every episode being played has one (g.mu held).
func (g *gather) ready() []*ask {
	if len(g.waiting) == 0 || len(g.waiting) < g.playing {
		return nil
	}
	return g.take()
}

// take empties the waiting list (g.mu held).
func (g *gather) take() []*ask {
	batch := g.waiting
	g.waiting = nil
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	return batch
}

// Generate waits with the other episodes' calls and returns this call's completions.
func (g *gather) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	a := &ask{reqs: reqs, done: make(chan answerOf, 1)}
	g.mu.Lock()
	g.waiting = append(g.waiting, a)
	batch := g.ready()
	if batch == nil && g.timer == nil {
		g.timer = time.AfterFunc(gatherWait, func() {
			g.mu.Lock()
			b := g.take()
			g.mu.Unlock()
			g.send(b)
		})
	}
	g.mu.Unlock()
	g.send(batch)
	select {
	case r := <-a.done:
		return r.comps, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// send generates a batch of calls in one Generate call; when it fails, each call is generated on its
// own, so that one episode's bad request fails no other.
func (g *gather) send(batch []*ask) {
	if len(batch) == 0 {
		return
	}
	g.mu.Lock()
	g.batches++
	g.gathered += len(batch)
	g.mu.Unlock()
	go func() {
		g.clk.gen.enter()
		defer g.clk.gen.leave()
		if len(batch) > 1 {
			var reqs []llm.Request
			for _, a := range batch {
				reqs = append(reqs, a.reqs...)
			}
			if comps, err := g.gen.Generate(g.ctx, reqs); err == nil && len(comps) == len(reqs) {
				for _, a := range batch {
					a.done <- answerOf{comps: comps[:len(a.reqs):len(a.reqs)]}
					comps = comps[len(a.reqs):]
				}
				return
			}
		}
		var wg sync.WaitGroup
		for _, a := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				comps, err := g.gen.Generate(g.ctx, a.reqs)
				a.done <- answerOf{comps: comps, err: err}
			}()
		}
		wg.Wait()
	}()
}
