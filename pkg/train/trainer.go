package train

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/report"
	"github.com/drmas/drmas/pkg/rollout"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
)

// Trainer is a Team being trained, made of components: the team's policies grouped into models
// with an optimizer each, the parallel strategy sharing the work among data-parallel ranks, the
// checkpointer that owns the run folder, the engines that serve rollouts, the source that gives each
// iteration its rollout and the reporter that tells about it. It holds the iteration it has reached.
type Trainer struct {
	*Team
	opt     Options
	norm    normalize.Options // the advantage estimator
	models  []*modelState     // sorted by id
	par     parallel          // how an iteration is shared among the group's ranks
	ckpt    *checkpointer     // the run folder: locked from New to Close, checkpoints, KL references
	engines *engine.Fleet     // the rollout engines kept serving the weights being trained
	source  rollout.Source    // each iteration's rollout: now, or generated ahead (rollout.max_staleness)
	report  *report.Reporter  // metrics.jsonl, TensorBoard, transcripts, the console (set by Run)
	step    int               // last completed iteration
	shape   shaping           // KL in the reward, loss balancing (shaping.go)
	state   runState
}

// shaping is what the iteration does to the scores and the loss around the advantages, beyond the
// estimator: the KL penalty in the reward (algorithm.kl_in_reward) and the invocation-frequency loss
// balance (algorithm.balance_loss_by_agent_freq). The zero value does nothing.
type shaping struct {
	balance bool
	// kl is the KL-in-reward coefficient and its controller (nil when off); the checkpointer saves
	// its Coef in trainer.json.
	kl       *normalize.AdaptiveKL
	klType   string
	adaptive bool
}

// runState says where the run stands besides its step. resumed: it continues from a checkpoint;
// saved: a checkpoint of step exists (written by save, or the one resumed from); warmupDone: the
// format warm-up is behind the weights (recorded in trainer.json, so that resuming from step-0
// never runs it again).
type runState struct {
	resumed, saved, warmupDone bool
}

// resume continues from a checkpoint: the optimizers, streaks, guard windows and KL references
// (checkpointer.restore), the step and the metrics file cut back to it.
func (t *Trainer) resume(ck string) error {
	var st rundir.TrainerState
	err := torch.Do(func() error {
		var err error
		st, err = t.ckpt.restore(ck, t.models)
		return err
	})
	if err != nil {
		return err
	}
	t.step = st.Step
	t.state = runState{resumed: true, saved: true, warmupDone: st.WarmupDone == nil || *st.WarmupDone}

	if t.par.group().Rank() == 0 {
		if err := rundir.TruncateMetrics(t.ckpt.dir, t.step); err != nil {
			return err
		}
	}
	log.Info().Int("step", t.step).Str("checkpoint", ck).Msg("resumed")
	return nil
}

// Close releases the team's resources and the run folder's lock.
func (t *Trainer) Close() {
	if t.source != nil {
		t.source.Close() // before the engines it generates on
	}
	t.engines.Close()
	t.Team.Close()
	t.ckpt.lock.Release()
}

// saveAlone is save where this rank may be the only one saving (after a failure).
func (t *Trainer) saveAlone() error {
	pending, err := t.pending()
	if err != nil {
		return err
	}
	return t.ckpt.saveAlone(t.step, t.models, pending)
}

// save writes the checkpoint of the last completed iteration. Torch thread.
func (t *Trainer) save() error {
	t.state.saved = true
	pending, err := t.pending()
	if err != nil {
		return err
	}
	return t.ckpt.save(t.step, t.models, pending)
}

// pending is what the rollout source keeps in a checkpoint (none before it exists).
func (t *Trainer) pending() ([]byte, error) {
	if t.source == nil {
		return nil, nil
	}
	return t.source.Pending()
}

// Run trains until run.steps, the context is cancelled (SIGINT/SIGTERM: the current iteration is
// finished and checkpointed) or run.max_minutes pass. It returns nil after a clean stop.
func (t *Trainer) Run(ctx context.Context) error {
	c := t.Config
	began := time.Now()
	if err := t.start(ctx); err != nil {
		return err
	}
	rep, err := report.New(report.Run{Dir: t.ckpt.dir, Config: c.Run.Config, Steps: c.Run.Steps, Step: t.step, ValK: c.Run.ValK,
		Console: t.opt.Progress, Primary: t.par.group().Rank() == 0, Transcripts: t.plan.transcripts, Render: t.render})
	if err != nil {
		return err
	}
	t.report = rep
	defer rep.Close()
	saved := t.step
	for t.step < c.Run.Steps {
		if stop, err := stopNow(ctx, t.par.group(), c.Run.MaxMinutes, began, t.step); stop || err != nil {
			if err != nil {
				return err
			}
			break
		}
		it := t.step + 1
		rec, err := t.iteration(context.WithoutCancel(ctx), it)
		if err != nil {
			if t.step > saved { // keep what was learned up to the failure
				if serr := torch.Do(func() error { return t.saveAlone() }); serr != nil {
					err = errors.Join(err, fmt.Errorf("checkpoint after the failure: %w", serr))
				}
			}
			return err
		}
		t.step = it
		if err := t.record(ctx, rec); err != nil {
			return err
		}
		if c.Run.SaveEvery > 0 && it%c.Run.SaveEvery == 0 {
			if err := torch.Do(t.save); err != nil {
				return err
			}
			saved = it
		}
	}
	if t.step > saved || !t.state.saved {
		if err := torch.Do(t.save); err != nil {
			return err
		}
	}
	if err := t.engines.Sync(context.WithoutCancel(ctx), t.step); err != nil { // engines serve the final weights
		return err
	}
	rep.Finish(t.step)
	log.Info().Int64("peak_rss_mb", torch.PeakResidentBytes()>>20).Msg("peak resident memory of this process") // VmHWM
	return nil
}

// start brings a run to its first iteration: a fresh run records its resolved config, warms the
// format up (warmup.go) when configured, and, after every rank holds rank 0's weights, freezes the
// KL references and saves step-0 (the post-warm-up weights, so a resume never redoes the warm-up).
// A resumed run rewrites nothing the run before it wrote.
func (t *Trainer) start(ctx context.Context) error {
	c := t.Config
	fresh := !t.state.resumed
	if fresh && t.par.group().Rank() == 0 {
		y, err := c.YAML()
		if err != nil {
			return err
		}
		if err := atomicfile.WriteBytes(filepath.Join(t.ckpt.dir, "config.yaml"), y); err != nil {
			return err
		}
	}
	if t.step == 0 && !t.state.warmupDone && c.Warmup.Steps > 0 {
		// Every rank: the same steps from the same seed, on whole models (dist.shard parameters:
		// gathered meanwhile, then cut again from rank 0's weights).
		err := t.par.whole(func() error {
			_, err := warmup(ctx, t.Team, t.models, t.ckpt.dir, t.par.group())
			return err
		})
		if err != nil {
			return err
		}
		if err := torch.Do(func() error { syncMasters(t.models); return nil }); err != nil {
			return err
		}
	}
	t.state.warmupDone = true
	// Data-parallel: every rank starts from rank 0's weights (checked).
	if err := torch.Do(func() error { return syncModels(t.par, t.Team, t.models) }); err != nil {
		return err
	}
	if !fresh {
		return nil
	}
	return torch.Do(func() error {
		if err := t.ckpt.saveReference(t.models); err != nil {
			return err
		}
		if c.Warmup.Steps > 0 {
			return t.save()
		}
		return nil
	})
}

// stopNow makes the stop decision, collective over the ranks: every rank stops at the same iteration
// when any rank wants to (a signal, run.max_minutes since began).
func stopNow(ctx context.Context, g *c10d.Group, maxMinutes int, began time.Time, step int) (bool, error) {
	interrupted := ctx.Err() != nil
	timeUp := maxMinutes > 0 && time.Since(began) > time.Duration(maxMinutes)*time.Minute
	stop, err := stopEverywhere(g, interrupted || timeUp)
	if err != nil || !stop {
		return false, err
	}
	switch {
	case timeUp:
		log.Warn().Int("minutes", maxMinutes).Msg("run.max_minutes reached: saving a checkpoint and stopping")
	case interrupted:
		log.Warn().Int("step", step).Msg("interrupted: saving a checkpoint and stopping")
	default:
		log.Warn().Int("step", step).Msg("another rank is stopping: saving a checkpoint and stopping")
	}
	return true, nil
}

// record validates when due and reports the iteration; data-parallel, rank 0 does it (the metrics
// are the same on every rank) while the others go on to the next rollout. A failed validation keeps
// the iteration (its metrics, without validation, and a checkpoint) and ends the run.
//
// Under dist.shard parameters rank 0's validation gathers the sharded weights unit by unit, so the
// others take part in its passes (settle) before going on.
func (t *Trainer) record(ctx context.Context, rec report.Iteration) error {
	c, it := t.Config, int(rec.Metrics[metric.Step])
	due := c.Run.TestFreq > 0 && (it%c.Run.TestFreq == 0 || it == c.Run.Steps)
	if t.par.group().Rank() != 0 {
		if due {
			return torch.Do(t.par.settle)
		}
		return nil
	}
	if due {
		err := t.validate(context.WithoutCancel(ctx), rec.Metrics)
		if serr := torch.Do(t.par.settle); err == nil {
			err = serr
		}
		if err != nil {
			if t.report.Record(rec) == nil {
				_ = torch.Do(func() error { return t.saveAlone() })
			}
			return err
		}
	}
	return t.report.Record(rec)
}

// validate runs the evaluator on the validation sets and adds val/... metrics.
func (t *Trainer) validate(ctx context.Context, m metric.Row) error {
	if len(t.Val) == 0 {
		return nil
	}
	began := time.Now()
	if err := t.engines.Publish(ctx, t.step); err != nil {
		return fmt.Errorf("validation: %w", err)
	}
	release := t.Router.HoldDecodingLayout()
	rep, err := env.Evaluate(ctx, t.Orchestra, t.engines.Generator(), t.Val, env.EvalOptions{K: t.Config.Run.ValK, Seed: t.Config.Run.Seed ^ 0x7a1})
	release()
	if err != nil {
		return fmt.Errorf("validation: %w", err)
	}
	for k, v := range rep.Metrics("val") {
		m[k] = v
	}
	m["time/validation"] = time.Since(began).Seconds()
	return nil
}
