package serve

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// job is one generation request or one weight reload, in arrival order.
type job struct {
	ctx      context.Context
	prompt   []int
	sampling llm.Sampling
	reload   string // folder to load instead of generating

	out  llm.Completion
	err  error
	done chan struct{}
}

// submit queues a generation and waits for its completion (or for the client to leave).
func (s *Server) submit(ctx context.Context, prompt []int, sp llm.Sampling) (llm.Completion, error) {
	j := &job{ctx: ctx, prompt: prompt, sampling: sp, done: make(chan struct{})}
	select {
	case s.jobs <- j:
	case <-ctx.Done():
		return llm.Completion{}, ctx.Err()
	}
	select {
	case <-j.done:
		return j.out, j.err
	case <-ctx.Done():
		return llm.Completion{}, ctx.Err()
	}
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
			first.err = s.load(first.reload)
			close(first.done)
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

// generateBatch generates the live jobs of a batch together and hands each its completion.
func (s *Server) generateBatch(batch []*job) {
	var live []*job
	for _, j := range batch {
		if j.ctx.Err() != nil {
			close(j.done) // the client left
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
	for i, j := range live {
		prompts[i], settings[i] = j.prompt, j.sampling
	}
	out, err := s.pol.GenerateIDs(context.Background(), prompts, settings)
	if err != nil && len(live) > 1 {
		// One bad request must not fail the others: redo them one by one to find it.
		for _, j := range live {
			one, err := s.pol.GenerateIDs(context.Background(), [][]int{j.prompt}, []llm.Sampling{j.sampling})
			if err == nil {
				j.out = one[0]
			}
			j.err = err
			close(j.done)
		}
		return
	}
	for i, j := range live {
		if err != nil {
			j.err = err
		} else {
			j.out = out[i]
		}
		close(j.done)
	}
}

// load reads the weights of dir (same architecture) and copies them into the served model in place,
// with dir's config.json (rope_theta, rms_norm_eps, max_position_embeddings: policy.Model.Reload),
// on the torch thread.
func (s *Server) load(dir string) error {
	began := time.Now()
	m := s.pol.Model
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
		return err
	}
	log.Info().Str("dir", dir).Dur("took", time.Since(began).Round(time.Millisecond)).Msg("weights reloaded")
	return nil
}
