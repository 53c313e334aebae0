package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rs/zerolog/log"
	"github.com/schollz/progressbar/v3"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// Run trains until run.steps, the context is cancelled (SIGINT/SIGTERM: the current iteration is
// finished and checkpointed) or run.max_minutes pass. It returns nil after a clean stop.
func (t *Trainer) Run(ctx context.Context) error {
	c := t.Config
	began := time.Now()
	fresh := !t.resumed // a resumed run rewrites nothing the run before it wrote
	if fresh && t.group.Rank() == 0 {
		y, err := c.YAML()
		if err != nil {
			return err
		}
		if err := atomicfile.WriteBytes(filepath.Join(t.dir, "config.yaml"), y); err != nil {
			return err
		}
	}
	if t.step == 0 && !t.warmupDone && c.Warmup.Steps > 0 {
		if _, err := t.warmup(ctx); err != nil { // every rank: the same steps from the same seed
			return err
		}
	}
	t.warmupDone = true
	// Data-parallel: every rank starts from rank 0's weights (checked).
	if err := torch.Do(t.syncModels); err != nil {
		return err
	}
	if fresh {
		if err := torch.Do(func() error {
			if t.anyKL() {
				if err := t.saveReference(); err != nil {
					return err
				}
			}
			if c.Warmup.Steps > 0 {
				return t.save() // step-0: the post-warm-up weights, so a resume never redoes the warm-up
			}
			return nil
		}); err != nil {
			return err
		}
	}
	bar := t.progress()
	saved := t.step
	for t.step < c.Run.Steps {
		interrupted := ctx.Err() != nil
		timeUp := c.Run.MaxMinutes > 0 && time.Since(began) > time.Duration(c.Run.MaxMinutes)*time.Minute
		stop, err := stopEverywhere(t.group, interrupted || timeUp)
		if err != nil {
			return err
		}
		if stop {
			switch {
			case timeUp:
				log.Warn().Int("minutes", c.Run.MaxMinutes).Msg("run.max_minutes reached: saving a checkpoint and stopping")
			case interrupted:
				log.Warn().Int("step", t.step).Msg("interrupted: saving a checkpoint and stopping")
			default:
				log.Warn().Int("step", t.step).Msg("another rank is stopping: saving a checkpoint and stopping")
			}
			break
		}
		it := t.step + 1
		m, err := t.iteration(context.WithoutCancel(ctx), it)
		if err != nil {
			if t.step > saved { // keep what was learned up to the failure
				if serr := torch.Do(t.saveAlone); serr != nil {
					err = errors.Join(err, fmt.Errorf("checkpoint after the failure: %w", serr))
				}
			}
			return err
		}
		t.step = it
		if err := t.record(ctx, bar, m); err != nil {
			return err
		}
		if c.Run.SaveEvery > 0 && it%c.Run.SaveEvery == 0 {
			if err := torch.Do(t.save); err != nil {
				return err
			}
			saved = it
		}
	}
	if bar != nil {
		_ = bar.Finish()
	}
	if t.step > saved || !t.saved {
		if err := torch.Do(t.save); err != nil {
			return err
		}
	}
	if err := t.engines.sync(context.WithoutCancel(ctx), t.step, t.models); err != nil { // engines serve the final weights
		return err
	}
	log.Info().Int("step", t.step).Str("dir", t.dir).Dur("took", time.Since(began).Round(time.Second)).Msg("training done")
	return nil
}

// record validates when due and writes the iteration's metrics; data-parallel, rank 0 does it (the
// metrics are the same on every rank) while the others go on to the next rollout.
func (t *Trainer) record(ctx context.Context, bar *progressbar.ProgressBar, m Metrics) error {
	if t.group.Rank() != 0 {
		return nil
	}
	c, it := t.Config, int(m["step"])
	if c.Run.TestFreq > 0 && (it%c.Run.TestFreq == 0 || it == c.Run.Steps) {
		if err := t.validate(context.WithoutCancel(ctx), m); err != nil {
			// Keep the iteration: its metrics (without validation) and a checkpoint.
			if merr := appendMetrics(t.dir, m); merr == nil {
				_ = torch.Do(t.saveAlone)
			}
			return err
		}
	}
	if err := appendMetrics(t.dir, m); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	t.report(bar, m)
	return nil
}

// validate runs the evaluator on the validation sets and adds val/... metrics.
func (t *Trainer) validate(ctx context.Context, m Metrics) error {
	if len(t.Val) == 0 {
		return nil
	}
	began := time.Now()
	if err := t.engines.ensure(ctx, t.step, t.models); err != nil {
		return fmt.Errorf("validation: %w", err)
	}
	release := t.Router.HoldDecodingLayout()
	rep, err := env.Evaluate(ctx, t.Orchestra, t.engines.generator(), t.Val, env.EvalOptions{K: t.Config.Run.ValK, Seed: t.Config.Run.Seed ^ 0x7a1})
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

func (t *Trainer) progress() *progressbar.ProgressBar {
	if t.opt.Progress == nil {
		return nil
	}
	bar := progressbar.NewOptions(t.Config.Run.Steps,
		progressbar.OptionSetWriter(t.opt.Progress),
		progressbar.OptionSetDescription("train"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish())
	_ = bar.Set(t.step)
	return bar
}

// report logs an iteration and advances the progress bar.
func (t *Trainer) report(bar *progressbar.ProgressBar, m Metrics) {
	var norms []string
	keys := make([]string, 0)
	for k := range m {
		if strings.HasPrefix(k, "grad_norm/agent/") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	ev := log.Info().Int("step", int(m["step"])).Float64("reward", round(m["reward/mean"]))
	if bar != nil {
		ev = log.Debug().Int("step", int(m["step"])).Float64("reward", round(m["reward/mean"]))
	}
	for _, k := range keys {
		a := strings.TrimPrefix(k, "grad_norm/agent/")
		norms = append(norms, fmt.Sprintf("%s %.3g", a, m[k]))
		ev = ev.Float64("gn_"+a, round(m[k]))
	}
	if v, ok := m["val/avg@"+fmt.Sprint(t.Config.Run.ValK)]; ok {
		ev = ev.Float64("val_avg", round(v))
	}
	ev.Float64("s", round(m["time/iteration"])).Msg("iteration")
	if bar != nil {
		bar.Describe(fmt.Sprintf("reward %.3f | grad %s", m["reward/mean"], strings.Join(norms, ", ")))
		_ = bar.Set(int(m["step"]))
	}
}

func round(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	return math.Round(x*1e4) / 1e4
}

// syncModels broadcasts every model's weights from rank 0 and verifies them (torch thread).
//
// The frozen bases of LoRA adapters too: the warm-up trains them on every rank.
func (t *Trainer) syncModels() error {
	for _, mc := range t.Config.Models {
		if !t.Config.IsFrozenBase(mc.ID) {
			continue
		}
		names, params := policy.SplitParams(t.Router[mc.ID].Model.Parameters())
		if err := syncWeights(t.group, names, params); err != nil {
			return fmt.Errorf("model %s (frozen base): %w", mc.ID, err)
		}
	}
	for _, ms := range t.models {
		if err := syncWeights(t.group, ms.names, ms.params); err != nil {
			return fmt.Errorf("model %s: %w", ms.id, err)
		}
	}
	return nil
}
