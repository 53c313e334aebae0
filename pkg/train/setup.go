package train

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// Options are run-time choices that are not part of the config.
type Options struct {
	Device   string    // the --device flag: default for models whose config names none
	Resume   bool      // continue from the latest checkpoint in run.dir
	Force    bool      // delete an existing run in run.dir and start over
	Progress io.Writer // where a progress bar is drawn (nil: none; logs only)
	// Group is the data-parallel process group this process is a rank of (nil: one process). Rank 0
	// owns the run folder; every rank reads the checkpoint it resumes from.
	Group *dist.Group
}

// Trainer is a Team being trained: the team's policies with an optimizer per model group, the run
// folder it checkpoints to and the iteration it has reached.
type Trainer struct {
	*Team
	lock   *runLock // held from New to Close: one writer per run folder
	opt    Options
	dir    string
	norm   normalize.Options
	models []*modelState // sorted by id
	byID   map[string]*modelState
	step   int // last completed iteration
	group  *dist.Group
	par    parallel // how an iteration is shared among the group's ranks

	// resumed: the run continues from a checkpoint (restore); saved: a checkpoint of step exists
	// (written by save, or the one resumed from); warmupDone: the format warm-up is behind the
	// weights (recorded in trainer.json, so that resuming from step-0 never runs it again).
	resumed, saved, warmupDone bool
	// savedBases: each frozen base's folder in the last checkpoint this process wrote, which the next
	// one hard-links instead of writing the unchanged weights again (checkpoint.go).
	savedBases map[string]string

	engines *engineSync // the rollout engines kept serving the weights being trained
}

// New prepares a run: the run folder, the team (data, orchestra, models; from the latest checkpoint
// when resuming) and an optimizer per model group. Call it from an ordinary goroutine (it enters the
// torch thread itself).
func New(ctx context.Context, cfg *config.Config, opt Options) (*Trainer, error) {
	norm, err := cfg.Algorithm.Normalization.Options()
	if err != nil {
		return nil, fmt.Errorf("algorithm.normalization: %w", err)
	}
	lock, resumeFrom, err := prepareRankDir(cfg.Run.Dir, opt)
	if err != nil {
		return nil, err
	}
	if resumeFrom != "" {
		if err := checkResumable(cfg, resumeFrom); err != nil {
			lock.Release()
			return nil, err
		}
	}
	team, err := LoadTeam(cfg, opt.Device, resumeFrom)
	if err != nil {
		lock.Release()
		return nil, err
	}
	models := newModels(cfg, team.Router)
	params := map[string][]*ts.Tensor{}
	for _, ms := range models {
		params[ms.id] = ms.params
	}
	par := newParallel(opt.Group, cfg.Dist.AgentNorms == "approx", cfg.Dist.Shard, params)
	t := &Trainer{Team: team, lock: lock, opt: opt, dir: cfg.Run.Dir, norm: norm, models: models, byID: map[string]*modelState{},
		group: opt.Group, par: par}
	for _, ms := range t.models {
		t.byID[ms.id] = ms
		ms.par = par
		if part := par.partition(ms.id); part != nil {
			log.Info().Str("model", ms.id).Str("shard", cfg.Dist.Shard).Int("parameters", len(ms.params)).
				Int64("elements_here", part.load[part.rank]).Float64("imbalance", part.imbalance()).Msg("sharded training state")
		}
	}
	if cfg.Algorithm.Guard.Window > 0 && opt.Group.Size() > 1 && cfg.Dist.AgentNorms == "approx" {
		// The guard judges an agent's share of the global gradient; approx only has the ranks' own.
		t.Close()
		return nil, fmt.Errorf("algorithm.guard needs dist.agent_norms: exact in data-parallel training (%d ranks): approx measures only each rank's own shares", opt.Group.Size())
	}
	err = torch.Do(func() error {
		for _, ms := range t.models {
			ms.opt = ms.newOptimizer(cfg, par.partition(ms.id))
			if ms.opt.Offload {
				log.Info().Str("model", ms.id).Int("parameters", len(ms.opt.Params)).Str("device", ms.pol.Model.Device().Name).
					Msg("optimizer state in host memory (models[].optim.offload: cpu): AdamW steps there")
			}
		}
		return nil
	})
	if err != nil {
		t.Close()
		return nil, err
	}
	if resumeFrom != "" {
		if err := t.restore(resumeFrom); err != nil {
			t.Close()
			return nil, err
		}
	}
	if t.engines, err = connectEngines(ctx, team, t.models, t.dir, t.group); err != nil { // an engine that is down stops the run before training
		t.Close()
		return nil, err
	}
	return t, nil
}

// Close releases the team's resources and the run folder's lock.
func (t *Trainer) Close() {
	t.engines.unloadAdapters()
	t.Team.Close()
	t.lock.Release()
}

// Step returns the last completed iteration.
func (t *Trainer) Step() int { return t.step }

// initConfig turns a config's `init:` section into a Hugging Face config for a random model.
func initConfig(in config.InitConfig, tokVocab int) (policy.Config, error) {
	or := func(v, dflt int) int {
		if v == 0 {
			return dflt
		}
		return v
	}
	raw, err := json.Marshal(map[string]any{
		"model_type":              in.ModelType,
		"hidden_size":             in.HiddenSize,
		"intermediate_size":       or(in.IntermediateSize, 4*in.HiddenSize),
		"num_hidden_layers":       in.NumHiddenLayers,
		"num_attention_heads":     in.NumAttentionHeads,
		"num_key_value_heads":     or(in.NumKeyValueHeads, in.NumAttentionHeads),
		"vocab_size":              or(in.VocabSize, tokVocab),
		"rope_theta":              in.RopeTheta,
		"tie_word_embeddings":     in.TieWordEmbeddings,
		"max_position_embeddings": in.MaxPosition,
		"initializer_range":       in.InitializerRange,
	})
	if err != nil {
		return policy.Config{}, err
	}
	return policy.ParseConfig(raw)
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// makeReference freezes a copy of each model's current weights as its KL reference, for the models
// whose agents use a KL penalty.
func (t *Trainer) makeReference() error {
	for _, ms := range t.models {
		if ms.usesKL() {
			if err := ms.makeReference(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *Trainer) anyKL() bool {
	for _, ms := range t.models {
		if ms.usesKL() {
			return true
		}
	}
	return false
}
