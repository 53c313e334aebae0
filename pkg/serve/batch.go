package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// job is one generation (one choice of a request) or one weight reload, in arrival order.
type job struct {
	ctx      context.Context
	prompt   []int
	sampling llm.Sampling
	top      int // top log-probs per token
	choice   int // index among its request's choices
	out      *stream
	emitted  atomic.Bool // a token has left (a failed batch is not redone for it)
	reload   string      // folder to load instead of generating
	rooted   bool        // reload: a folder a client named under the weights root (its files are checked again)
	lora     *served     // the adapter it runs on (nil: the base); held until it ends
	routes   bool        // record its routed experts
	ended    func()      // releases lora

	err  error // a reload's
	done chan struct{}
}

// event is what a request's stream carries: a token of one choice, or that choice's end (end set;
// comp or err).
type event struct {
	choice int
	tok    policy.Token
	end    bool
	comp   llm.Completion
	err    error
}

// stream gathers the events of one request's choices. push never blocks (the batching loop and
// the torch thread push into it); the handler drains it.
type stream struct {
	mu     sync.Mutex
	items  []event
	notify chan struct{}
}

func newStream() *stream { return &stream{notify: make(chan struct{}, 1)} }

func (s *stream) push(e event) {
	s.mu.Lock()
	s.items = append(s.items, e)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// next waits for events (or ctx's end) and returns those queued.
func (s *stream) next(ctx context.Context) ([]event, error) {
	for {
		s.mu.Lock()
		items := s.items
		s.items = nil
		s.mu.Unlock()
		if len(items) > 0 {
			return items, nil
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// choice is one completion a request asks for.
type choice struct {
	prompt   []int
	sampling llm.Sampling
	top      int
	lora     *served // nil: the base
	routes   bool    // record the experts its tokens are routed to (a mixture of experts)
}

// start queues a request's choices (they are batched with whatever else is queued) and returns the
// stream their tokens and ends arrive on: every choice ends with exactly one end event. A choice
// whose request's ctx ends stops at its next token and frees its row. Each queued choice holds its
// adapter until it ends.
func (s *Server) start(ctx context.Context, choices []choice) (*stream, error) {
	out := newStream()
	for i, c := range choices {
		j := &job{ctx: ctx, prompt: c.prompt, sampling: c.sampling, top: c.top, choice: i, out: out, lora: c.lora, routes: c.routes}
		if c.lora != nil {
			s.loras.hold(c.lora)
			j.ended = sync.OnceFunc(func() { s.releaseLoRA(c.lora) })
		}
		select {
		case s.jobs <- j:
		case <-ctx.Done():
			if j.ended != nil {
				j.ended()
			}
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// run is the batching loop: it takes the first queued job, gathers the generations that arrive
// within the window (up to MaxBatch, stopping at a reload, which must see the batch before it done)
// and runs them as one batch. It returns when ctx ends.
func (s *Server) run(ctx context.Context) {
	// The weights change only in load (which drops it): the CPU decoding layout is packed once, not
	// per batch.
	defer s.pol.HoldDecodingLayout()()
	var held *job // a reload that ended the previous gathering
	for {
		first := held
		held = nil
		if first == nil {
			select {
			case first = <-s.jobs:
			case <-ctx.Done():
				return
			}
		}
		if first.reload != "" {
			first.err = s.load(first.reload, first.rooted)
			close(first.done)
			continue
		}
		if first.ctx.Err() != nil {
			first.finish(llm.Completion{}, first.ctx.Err()) // its client left while it waited
			continue
		}
		if !s.opt.Static {
			held = s.runContinuous(first)
			continue
		}
		batch := []*job{first}
		timer := time.NewTimer(s.opt.Window)
	gather:
		for len(batch) < s.opt.MaxBatch {
			select {
			case j := <-s.jobs:
				if j.reload != "" {
					held = j
					break gather
				}
				batch = append(batch, j)
			case <-timer.C:
				break gather
			}
		}
		timer.Stop()
		s.generateBatch(batch)
	}
}

// runContinuous generates first and the requests that arrive while it runs with continuous
// batching: a queued request takes a finished row's slot at the next decoding step. It stops taking
// requests at a reload (returned, to run once the rows in flight are done) or when other work waits
// for the torch thread (an adapter load), and returns when no row is in flight.
func (s *Server) runContinuous(first *job) (held *job) {
	next := func() *policy.Job {
		for {
			var j *job
			switch {
			case first != nil:
				j, first = first, nil
			case held != nil || torch.Waiting() > 0:
				return nil
			default:
				select {
				case j = <-s.jobs:
				default:
					return nil
				}
			}
			if j.reload != "" {
				held = j
				return nil
			}
			if j.ctx.Err() != nil {
				j.finishOff(llm.Completion{}, j.ctx.Err()) // its client left while it waited
				continue
			}
			return &policy.Job{Prompt: j.prompt, Sampling: j.sampling, Opt: s.rowOptions(j), Done: j.finishOff}
		}
	}
	s.batches.Add(1)
	if err := s.pol.GenerateJobs(context.Background(), s.opt.MaxBatch, next); err != nil {
		log.Error().Err(err).Msg("generation failed; the requests in flight were answered with the error")
	}
	return held
}

// finishOff is finish from the torch thread: the job's adapter is released on another goroutine
// (freeing an adapter enters torch.Do, which waits until the generation in flight returns).
func (j *job) finishOff(c llm.Completion, err error) {
	j.out.push(event{choice: j.choice, end: true, comp: c, err: err})
	if j.ended != nil {
		go j.ended()
	}
}

// finish ends a generation job.
func (j *job) finish(c llm.Completion, err error) {
	j.out.push(event{choice: j.choice, end: true, comp: c, err: err})
	if j.ended != nil {
		j.ended()
	}
}

// rowOptions hands j's tokens to its stream as they are sampled.
func (s *Server) rowOptions(j *job) policy.RowOptions {
	o := policy.RowOptions{Ctx: j.ctx, TopLogProbs: j.top, OnToken: func(t policy.Token) {
		s.tokens.Add(1)
		j.emitted.Store(true)
		j.out.push(event{choice: j.choice, tok: t})
	}}
	if j.lora != nil {
		o.Adapter = j.lora.key
	}
	if j.routes {
		o.Record = new(policy.Routes)
	}
	return o
}

// generateBatch generates the live jobs of a batch together; each job's tokens leave as they are
// sampled, and its end when the batch is done.
func (s *Server) generateBatch(batch []*job) {
	var live []*job
	for _, j := range batch {
		if j.ctx.Err() != nil {
			j.finish(llm.Completion{}, j.ctx.Err()) // the client left
			continue
		}
		live = append(live, j)
	}
	if len(live) == 0 {
		return
	}
	s.batches.Add(1)
	prompts := make([][]int, len(live))
	settings := make([]llm.Sampling, len(live))
	opts := make([]policy.RowOptions, len(live))
	for i, j := range live {
		prompts[i], settings[i], opts[i] = j.prompt, j.sampling, s.rowOptions(j)
	}
	out, err := s.pol.GenerateStream(context.Background(), prompts, settings, opts)
	if err != nil && len(live) > 1 {
		// One bad request must not fail the others: redo them one by one to find it (those whose
		// tokens have already left get the error: their clients have seen a partial answer).
		for _, j := range live {
			if j.emitted.Load() {
				j.finish(llm.Completion{}, err)
				continue
			}
			one, err := s.pol.GenerateStream(context.Background(), [][]int{j.prompt}, []llm.Sampling{j.sampling}, []policy.RowOptions{s.rowOptions(j)})
			if err != nil {
				j.finish(llm.Completion{}, err)
			} else {
				j.finish(one[0], nil)
			}
		}
		return
	}
	for i, j := range live {
		if err != nil {
			j.finish(llm.Completion{}, err)
		} else {
			j.finish(out[i], nil)
		}
	}
}

// nonFinite names the first of the weights ps (a model's or an adapter's Parameters) with a NaN or
// infinite value ("" when all are finite). On the torch thread.
func nonFinite(ps []policy.Param) string { return torch.FirstNonFinite(policy.SplitParams(ps)) }

// load reads the weights of dir (same architecture) and copies them into the served model in place,
// with dir's config.json (rope_theta, rms_norm_eps, max_position_embeddings: policy.Model.Reload),
// on the torch thread.
//
// A folder a client named (rooted) has its files checked against the weights root once more just
// before they are opened (the reload may have waited behind generation batches since the request
// was checked). The error a client gets quotes no bytes of the files (scrub); the log has it whole.
func (s *Server) load(dir string, rooted bool) error {
	began := time.Now()
	m := s.pol.Model
	if rooted {
		if err := s.filesWithin("model_path", dir, dir); err != nil {
			return err
		}
	}
	err := torch.Do(func() error {
		fresh, err := policy.Load(dir, m.Device(), m.DType())
		if err != nil {
			return err
		}
		defer func() {
			for _, p := range fresh.Parameters() {
				p.T.MustDrop()
			}
		}()
		if name := nonFinite(fresh.Parameters()); name != "" {
			return fmt.Errorf("load %s: weight %s holds NaN or infinite values: refused, still serving the previous weights", dir, name)
		}
		s.mu.Lock() // the handlers read the configuration under s.mu (checkPrompt, models)
		defer s.mu.Unlock()
		if err := m.Reload(fresh); err != nil {
			return fmt.Errorf("load %s: %w", dir, err)
		}
		return nil
	})
	s.pol.DropDecodingLayout() // packed from the weights before
	torch.ReleaseMemory()
	if err != nil {
		log.Error().Str("dir", dir).Err(err).Msg("weight reload failed; still serving the previous weights")
		return errors.New(scrub(err))
	}
	log.Info().Str("dir", dir).Dur("took", time.Since(began).Round(time.Millisecond)).Msg("weights reloaded")
	return nil
}
