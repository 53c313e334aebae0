package train

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/rollout"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/shard"
	"github.com/drmas/drmas/pkg/team"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"
)

// New prepares a run: the run folder, the team (data, orchestra, models; from the latest checkpoint
// when resuming) and an optimizer per model group. Call it from an ordinary goroutine (it enters the
// torch thread itself).
func New(ctx context.Context, cfg *config.Config, opt Options) (*Trainer, error) {
	norm, err := cfg.Algorithm.Normalization.Options()
	if err != nil {
		return nil, fmt.Errorf("algorithm.normalization: %w", err)
	}
	lock, resumeFrom, err := prepareRankDir(cfg.Run.Dir, opt.Group, opt.Resume, opt.Force)
	if err != nil {
		return nil, err
	}
	if resumeFrom != "" {
		if err := cfg.CheckResumable(resumeFrom); err != nil {
			lock.Release()
			return nil, err
		}
	}
	// dist.shard parameters: each model is cut into shards as soon as it is loaded.
	weights := shard.New(opt.Group, cfg.Dist)
	team, err := openTeam(cfg)
	if err == nil {
		err = team.load(opt.Device, resumeFrom, weights.Adopt)
	}
	if err != nil {
		lock.Release()
		return nil, err
	}
	models := newModels(cfg, team.Router, cfg.Run.Seed)
	par := newParallel(opt.Group, cfg.Dist, paramsByModel(models), weights)
	shape := newShaping(cfg.Algorithm)
	t := &Trainer{Team: team, opt: opt, norm: norm, models: models, par: par, shape: shape,
		ckpt: &checkpointer{dir: cfg.Run.Dir, run: cfg.Run, lock: lock, cfg: cfg, router: team.Router, par: par, klCoef: shape.kl}}
	if cfg.Algorithm.Guard.Window > 0 && opt.Group.Size() > 1 && cfg.Dist.AgentNorms == dist.NormsApprox {
		// The guard judges an agent's share of the global gradient; approx only has the ranks' own.
		t.Close()
		return nil, fmt.Errorf("algorithm.guard needs dist.agent_norms: exact in data-parallel training (%d ranks): approx measures only each rank's own shares", opt.Group.Size())
	}
	if err := torch.Do(func() error { return setupOptimizers(cfg.Agents, cfg.Dist.Shard, models, par) }); err != nil {
		t.Close()
		return nil, err
	}
	if resumeFrom != "" {
		if err := t.resume(resumeFrom); err != nil {
			t.Close()
			return nil, err
		}
	}
	if t.engines, err = openEngines(ctx, team, t.models, cfg.Run.Dir, fleetGroup{par}, opt.Launch); err != nil { // an engine that is down stops the run before training
		t.Close()
		return nil, err
	}
	if cfg.Rollout.MaxStaleness > 0 {
		if err := pipelineFits(cfg.Rollout.MaxStaleness, cfg.Algorithm.FilterGroups.Enable, cfg.SampledBy, t.models, opt.Group.Size()); err != nil {
			t.Close()
			return nil, err
		}
	}
	t.source, err = rollout.Open(cfg.Rollout, player{t}, rollout.Options{Solo: opt.Group.Size() == 1, Reload: t.engines.ReloadAhead,
		Resume: resumeFrom, Step: t.step})
	if err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// paramsByModel maps each model group's id to its parameters.
func paramsByModel(models []*modelState) map[string][]*ts.Tensor {
	out := map[string][]*ts.Tensor{}
	for _, ms := range models {
		out[ms.id] = ms.params
	}
	return out
}

// setupOptimizers gives each model group the strategy and an AdamW over the parameters this rank
// holds the state of. Torch thread.
func setupOptimizers(agents []team.Agent, stage string, models []*modelState, par parallel) error {
	for _, ms := range models {
		ms.par = par
		if names, shards := par.state(ms.id); shards != nil { // dist.shard parameters: the shards train
			ms.names, ms.params = names, shards
		}
		part := par.partition(ms.id)
		if par.sharded(ms.id) {
			log.Info().Str("model", ms.id).Str("shard", stage).Int("units", len(ms.params)).Int64("elements_here", elements(ms.params)).
				Msg("sharded weights, gradients and optimizer state")
			part = nil // the optimizer steps this rank's shards
		} else if part != nil {
			log.Info().Str("model", ms.id).Str("shard", stage).Int("parameters", len(ms.params)).
				Int64("elements_here", part.Load[part.Rank]).Float64("imbalance", part.Imbalance()).Msg("sharded training state")
		}
		ms.opt = ms.newOptimizer(agents, part)
		if ms.opt.Offload {
			log.Info().Str("model", ms.id).Int("parameters", len(ms.opt.Params)).Str("device", ms.pol.Model.Device().Name).
				Msg("optimizer state in host memory (models[].optim.offload: cpu): AdamW steps there")
		}
	}
	return nil
}

// pipelineFits checks that rollouts may run ahead of training (rollout.max_staleness ≥ 1): every
// trained model's rollouts on serving engines (an in-process rollout samples the weights being
// trained: it cannot lag them, nor run beside the update on the torch thread).
func pipelineFits(k int, filterGroups bool, sampledBy func(model.Config) model.Config, models []*modelState, ranks int) error {
	if filterGroups && ranks > 1 {
		return fmt.Errorf("rollout.max_staleness %d with algorithm.filter_groups: rollouts ahead of training with %d data-parallel ranks cannot draw more tasks beside the update (the groups to drop are known only once the ranks' shares are gathered); turn one of them off",
			k, ranks)
	}
	for _, ms := range models {
		if !sampledBy(ms.cfg).Rollout.Served() {
			return fmt.Errorf("rollout.max_staleness %d: model %s's rollouts are in-process (models[].rollout.engine: local); rollouts ahead of training need serving engines (managed, sglang, vllm, openai)",
				k, ms.id)
		}
	}
	return nil
}

// Options are run-time choices that are not part of the config.
type Options struct {
	Device   string    // the --device flag: default for models whose config names none
	Resume   bool      // continue from the latest checkpoint in run.dir
	Force    bool      // delete an existing run in run.dir and start over
	Progress io.Writer // where a progress bar is drawn (nil: none; logs only)
	// Group is the data-parallel process group this process is a rank of (nil: one process). Rank 0
	// owns the run folder; every rank reads the checkpoint it resumes from.
	Group *c10d.Group
	// Launch runs `drmas` for managed rollout replicas (nil: this executable; tests run their binary).
	Launch engine.Launcher
}

// prepareRankDir is rundir.Prepare on rank 0; the other ranks learn from it which checkpoint to resume
// from (they read it from the same folder, which must be on a filesystem every rank sees).
func prepareRankDir(dir string, g *c10d.Group, resume, force bool) (*rundir.Lock, string, error) {
	if g.Size() == 1 {
		return rundir.Prepare(dir, resume, force)
	}
	step := []float64{-1}
	var ck string
	var lock *rundir.Lock
	var err error
	if g.Rank() == 0 {
		if lock, ck, err = rundir.Prepare(dir, resume, force); err != nil {
			return nil, "", err // the other ranks see rank 0 leave and stop
		}
		if s, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(ck), rundir.StepPrefix)); ck != "" && err == nil {
			step[0] = float64(s)
		}
	}
	if err := g.AllReduceFloats(step, c10d.Max); err != nil {
		lock.Release()
		return nil, "", err
	}
	if step[0] < 0 {
		return lock, "", nil
	}
	return lock, rundir.CheckpointDir(dir, int(step[0])), nil
}
