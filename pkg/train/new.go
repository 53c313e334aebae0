package train

import (
	"context"
	"fmt"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/drmas/drmas/pkg/train/algo"
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
		if err := rundir.CheckResumable(cfg, resumeFrom); err != nil {
			lock.Release()
			return nil, err
		}
	}
	team, err := LoadTeam(cfg, opt.Device, resumeFrom)
	if err != nil {
		lock.Release()
		return nil, err
	}
	models := newModels(cfg, team.Router, cfg.Run.Seed)
	par := newParallel(opt.Group, cfg.Dist.AgentNorms, cfg.Dist.Shard, paramsByModel(models))
	shape := newShaping(cfg.Algorithm)
	t := &Trainer{Team: team, opt: opt, norm: norm, models: models, par: par, shape: shape,
		ckpt: &checkpointer{dir: cfg.Run.Dir, run: cfg.Run, lock: lock, cfg: cfg, router: team.Router, par: par, klCoef: shape.kl}}
	if cfg.Algorithm.Guard.Window > 0 && opt.Group.Size() > 1 && cfg.Dist.AgentNorms == algo.NormsApprox {
		// The guard judges an agent's share of the global gradient; approx only has the ranks' own.
		t.Close()
		return nil, fmt.Errorf("algorithm.guard needs dist.agent_norms: exact in data-parallel training (%d ranks): approx measures only each rank's own shares", opt.Group.Size())
	}
	if err := torch.Do(func() error { return setupOptimizers(cfg, models, par) }); err != nil {
		t.Close()
		return nil, err
	}
	if resumeFrom != "" {
		if err := t.resume(resumeFrom); err != nil {
			t.Close()
			return nil, err
		}
	}
	if t.engines, err = connectEngines(ctx, team, t.models, cfg.Run.Dir, opt.Group); err != nil { // an engine that is down stops the run before training
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
func setupOptimizers(cfg *config.Config, models []*modelState, par parallel) error {
	for _, ms := range models {
		ms.par = par
		part := par.partition(ms.id)
		if part != nil {
			log.Info().Str("model", ms.id).Str("shard", cfg.Dist.Shard).Int("parameters", len(ms.params)).
				Int64("elements_here", part.load[part.rank]).Float64("imbalance", part.imbalance()).Msg("sharded training state")
		}
		ms.opt = ms.newOptimizer(cfg, part)
		if ms.opt.Offload {
			log.Info().Str("model", ms.id).Int("parameters", len(ms.opt.Params)).Str("device", ms.pol.Model.Device().Name).
				Msg("optimizer state in host memory (models[].optim.offload: cpu): AdamW steps there")
		}
	}
	return nil
}
