package train

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"sort"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/normalize"
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

	// Rollout engines (models[].rollout): the generator rollouts and validation use, the engine
	// clients by model id, the step whose weights the engines serve (-1: none yet) and the seconds
	// spent syncing since the last metrics row.
	gen         llm.Generator
	engines     map[string]*engine.Client
	synced      int
	syncSeconds float64
	// LoRA adapters on an engine-served frozen base (issue #27): the base's client by base id, the
	// folder and version each base was synced from (once: frozen after the warm-up; kept for replicas
	// that rejoin), and the name each adapter's latest version is loaded under on its base's engine.
	bases         map[string]*engine.Client
	basesSynced   map[string][2]string
	adapterServed map[string]string
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
	t := &Trainer{Team: team, lock: lock, opt: opt, dir: cfg.Run.Dir, norm: norm, models: newModels(cfg, team.Router), byID: map[string]*modelState{},
		group: opt.Group, par: newParallel(opt.Group, cfg.Dist.AgentNorms == "approx", cfg.Dist.Shard)}
	for _, ms := range t.models {
		t.byID[ms.id] = ms
		ms.par = t.par
		if _, ok := t.par.(*sharded); ok {
			ms.part = partitionOf(ms.params, opt.Group.Size(), opt.Group.Rank())
			log.Info().Str("model", ms.id).Str("shard", cfg.Dist.Shard).Int("parameters", len(ms.params)).
				Int64("elements_here", ms.part.load[ms.part.rank]).Float64("imbalance", ms.part.imbalance()).Msg("sharded training state")
		}
	}
	if cfg.Algorithm.Guard.Window > 0 && opt.Group.Size() > 1 && cfg.Dist.AgentNorms == "approx" {
		// The guard judges an agent's share of the global gradient; approx only has the ranks' own.
		t.Close()
		return nil, fmt.Errorf("algorithm.guard needs dist.agent_norms: exact in data-parallel training (%d ranks): approx measures only each rank's own shares", opt.Group.Size())
	}
	err = torch.Do(func() error {
		for _, ms := range t.models {
			ms.opt = ms.newOptimizer(cfg)
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
	if err := t.setupEngines(ctx); err != nil { // an engine that is down stops the run before training
		t.Close()
		return nil, err
	}
	return t, nil
}

// Close releases the team's resources and the run folder's lock.
func (t *Trainer) Close() {
	t.unloadAdapters()
	t.Team.Close()
	t.lock.Release()
}

// unloadAdapters drops from the engines the adapter versions this run loaded (rank 0 loads them),
// so that a run, finished or failed, leaves no adapter holding an engine's memory or LoRA slots;
// each checkpoint holds the adapters for serving later.
func (t *Trainer) unloadAdapters() {
	if len(t.adapterServed) == 0 || t.group.Rank() != 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := make([]string, 0, len(t.adapterServed))
	for id := range t.adapterServed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if c := t.engines[id]; c != nil {
			if err := c.UnloadAdapter(ctx, t.adapterServed[id]); err != nil {
				log.Warn().Str("model", id).Str("lora", t.adapterServed[id]).Err(err).Msg("could not unload the run's last adapter version from the engines")
			}
		}
		delete(t.adapterServed, id)
	}
}

// Step returns the last completed iteration.
func (t *Trainer) Step() int { return t.step }

// initConfig turns a config's `init:` section into a Hugging Face config for a random model.
func initConfig(in config.InitConfig, tokVocab int) (arch.Config, error) {
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
		return arch.Config{}, err
	}
	return arch.ParseConfig(raw)
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
