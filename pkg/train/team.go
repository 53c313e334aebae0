package train

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/check"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/team"
	"github.com/drmas/drmas/pkg/torch"
)

// loadPolicy builds the policy of one configured model: from `from` (a model folder of a checkpoint)
// when set, else from models[].path, else randomly initialised from models[].init. Torch thread.
func loadPolicy(mc model.Config, defaultDevice string, seed int64, from string) (*policy.Policy, error) {
	dev := mc.Device
	if dev == "" {
		dev = defaultDevice
	}
	device, err := torch.ParseDevice(dev)
	if err != nil {
		return nil, fmt.Errorf("model %s: device: %w", mc.ID, err)
	}
	dtype, err := policy.ParseDType(mc.DType)
	if err != nil {
		return nil, fmt.Errorf("model %s: dtype: %w", mc.ID, err)
	}
	if from == "" {
		from = mc.Path
	}
	if from != "" {
		p, err := policy.LoadPolicy(mc.ID, from, device, dtype)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", mc.ID, err)
		}
		if mc.Path != "" {
			p.SourceDir = mc.Path // checkpoints keep the original tokenizer configuration
		}
		return p, nil
	}
	tok, err := tokenizer.Load(mc.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("model %s: tokenizer: %w", mc.ID, err)
	}
	chat, err := tokenizer.LoadChatTemplate(filepath.Dir(mc.Tokenizer))
	if err != nil {
		return nil, fmt.Errorf("model %s: chat template: %w", mc.ID, err)
	}
	pc, err := mc.Init.ArchConfig(tok.VocabSize())
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", mc.ID, err)
	}
	m, err := policy.NewRandom(pc, device, dtype, seed+int64(hashString(mc.ID)%1000003))
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", mc.ID, err)
	}
	p, err := policy.NewPolicy(mc.ID, m, tok, chat)
	if err != nil {
		return nil, err
	}
	p.SourceDir = filepath.Dir(mc.Tokenizer)
	return p, nil
}

// loadAdapterPolicy builds the policy of an adapter entry on its base's policy: the adapter read
// from the PEFT folder from when set, else new with PEFT's initialisation (B = 0: the base), in the
// base's dtype (AdamW keeps float32 masters of a half one) on its device. Torch thread.
func loadAdapterPolicy(mc model.Config, seed int64, base *policy.Policy, from, baseName string) (*policy.Policy, error) {
	if base == nil {
		return nil, fmt.Errorf("model %s: base %q is not loaded", mc.ID, mc.Base)
	}
	m := base.Model
	var a *policy.Adapter
	var err error
	if from != "" {
		if a, err = policy.LoadAdapter(from, mc.ID, m, m.DType()); err != nil {
			return nil, fmt.Errorf("model %s: %w", mc.ID, err)
		}
		if want := loraConfig(mc.LoRA); a.Config.Rank != want.Rank || a.Config.Alpha != want.Alpha || !slices.Equal(a.Config.Targets, want.Targets) {
			a.Free()
			return nil, fmt.Errorf("model %s: %s has r %d, alpha %g, targets %v; models[%s].lora says rank %d, alpha %g, targets %v",
				mc.ID, from, a.Config.Rank, a.Config.Alpha, a.Config.Targets, mc.ID, want.Rank, want.Alpha, want.Targets)
		}
	} else if a, err = policy.NewAdapter(m, mc.ID, loraConfig(mc.LoRA), m.DType(), seed+int64(hashString(mc.ID)%1000003)); err != nil {
		return nil, fmt.Errorf("model %s: %w", mc.ID, err)
	}
	a.BaseModel = baseName
	return policy.NewAdapterPolicy(mc.ID, base, a)
}

// loraConfig is a config's lora section as pkg/policy takes it (targets expanded).
func loraConfig(l model.LoRA) policy.LoRAConfig {
	c := policy.LoRAConfig{Rank: l.Rank, Alpha: l.Alpha, Dropout: l.Dropout, Targets: l.TargetModules}
	if t, err := arch.ExpandTargets(l.TargetModules); err == nil {
		c.Targets = t
	}
	return c
}

// Team is a configured multi-agent system ready to run: its world opened (pkg/team: the orchestra,
// its tools, the retriever, the training tasks and validation sets) and the policies of its models.
// A Trainer trains one; `drmas eval` and the counterfactual gradient inspection use one as it is.
type Team struct {
	*team.Team
	Config *config.Config
	Router policy.Router
	plan   rolloutPlan // the config's rollout settings, resolved
}

// LoadTeam opens the team's world (pkg/team) and builds the policies of a config, with the
// weights of checkpoint when it is set: a run's step-N folder (one sub-folder per model id) or, for a
// one-model config, a model folder. Call it from an ordinary goroutine.
func LoadTeam(cfg *config.Config, device, checkpoint string) (*Team, error) {
	team, err := openTeam(cfg)
	if err != nil {
		return nil, err
	}
	if err := team.load(device, checkpoint, nil); err != nil {
		return nil, err
	}
	return team, nil
}

// load builds the team's policies (LoadTeam), handing each full model to adopt (nil: none) as soon
// as it is loaded, on the torch thread, trained (not a frozen base) or not: under dist.shard
// parameters the model is cut into this rank's shards before the next one loads. A failed load
// closes the team.
func (t *Team) load(device, checkpoint string, adopt func(id string, m *policy.Model, trained bool) error) error {
	cfg := t.Config
	err := torch.Do(func() error {
		torch.SetupThreads(torch.Threads{IntraOp: cfg.Run.Threads, BLAS: cfg.Run.Threads}) // run.threads bounds the matrix products too
		torch.ManualSeed(cfg.Run.Seed)
		for _, mc := range cfg.Models { // full models first: adapters need their base
			if mc.IsAdapter() {
				continue
			}
			from, err := checkpointModelDir(checkpoint, mc.ID, len(cfg.Models))
			if err != nil {
				return err
			}
			p, err := loadPolicy(mc, device, cfg.Run.Seed, from)
			if err != nil {
				return err
			}
			p.MaxBatch, p.KVTokens = mc.Rollout.MaxBatch, mc.Rollout.KVTokens // engine local's bounds; adapters take their base's
			t.Router[mc.ID] = p
			m := p.Model
			if cfg.IsFrozenBase(mc.ID) {
				m.Freeze()
			}
			log.Info().Str("model", mc.ID).Str("from", firstNonEmpty(from, mc.Path, "random init")).Str("type", m.Config.ModelType).
				Int64("params", m.Config.NumParams()).Str("device", torch.DeviceString(m.Device())).Str("dtype", mc.DType).
				Bool("frozen_base", cfg.IsFrozenBase(mc.ID)).Msg("model loaded")
			if adopt != nil {
				if err := adopt(mc.ID, m, !cfg.IsFrozenBase(mc.ID)); err != nil {
					return err
				}
			}
		}
		for _, mc := range cfg.Models {
			if !mc.IsAdapter() {
				continue
			}
			from, err := checkpointModelDir(checkpoint, mc.ID, len(cfg.Models))
			if err != nil {
				return err
			}
			p, err := loadAdapterPolicy(mc, cfg.Run.Seed, t.Router[mc.Base], firstNonEmpty(from, mc.LoRA.Path), firstNonEmpty(cfg.WeightsOf(mc).Path, mc.Base))
			if err != nil {
				return err
			}
			t.Router[mc.ID] = p
			a := p.Model.Adapter()
			log.Info().Str("model", mc.ID).Str("base", mc.Base).Str("from", firstNonEmpty(from, mc.LoRA.Path, "PEFT init")).Int("rank", a.Config.Rank).
				Float64("alpha", a.Config.Alpha).Strs("targets", a.Config.Targets).Int64("params", a.NumParams()).Msg("adapter loaded")
		}
		return nil
	})
	if err != nil {
		t.Close()
	}
	return err
}

// checkpointModelDir finds a model's folder in a checkpoint.
func checkpointModelDir(checkpoint, id string, models int) (string, error) {
	if checkpoint == "" {
		return "", nil
	}
	if _, err := os.Stat(checkpoint); err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", checkpoint, err)
	}
	if d := filepath.Join(checkpoint, id); fileExists(filepath.Join(d, "config.json")) || policy.IsAdapterDir(d) {
		return d, nil
	}
	if models == 1 && fileExists(filepath.Join(checkpoint, "config.json")) {
		return checkpoint, nil
	}
	return "", fmt.Errorf("checkpoint %s has no model folder %s/ (with config.json, or adapter_config.json for an adapter)", checkpoint, id)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// openTeam opens the team's world and loads its data, each record's first prompts measured with
// the team's tools (pkg/check: an over-long one refused, naming its file and line, or skipped): a
// Team whose policies are not loaded yet (load).
func openTeam(cfg *config.Config) (*Team, error) {
	world, err := team.Open(cfg.Config, cfg.EnvAgents(cfg.ModelType))
	if err != nil {
		return nil, err
	}
	var keep func(env.Task) (bool, error)
	if !cfg.IsToy() {
		pc, err := check.NewPrompts(cfg, world.Tools)
		if err != nil {
			world.Close()
			return nil, err
		}
		keep = pc.Keep
	}
	if err := world.Load(cfg.Config, cfg.Run.ValLimit, keep); err != nil {
		world.Close()
		return nil, err
	}
	return &Team{Team: world, Config: cfg, Router: policy.Router{}, plan: newRolloutPlan(cfg.Algorithm, cfg.Run.Seed, cfg.Config)}, nil
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// rolloutPlan is what an iteration's rollout needs of the config, resolved once: the batch of
// tasks (algorithm.batch_size, drawn from a permutation seeded by run.seed), the episodes per task
// (algorithm.group_size), the model each agent's calls train, and when and under which name the
// transcripts are dumped (run.dump_every).
type rolloutPlan struct {
	batchSize, groupSize int
	seed                 int64
	modelOf              map[string]string // agent → model id
	transcripts          string            // the task name transcripts are written under
	draws                int               // algorithm.filter_groups: batches of tasks rolled out at most (0: off)
}

// newRolloutPlan resolves the rollout settings of the algorithm section, the run's seed and the team.
func newRolloutPlan(a algo.Config, seed int64, t team.Config) rolloutPlan {
	p := rolloutPlan{batchSize: a.BatchSize, groupSize: a.GroupSize, seed: seed,
		modelOf: map[string]string{}, transcripts: "train"}
	if f := a.FilterGroups; f.Enable {
		p.draws = f.MaxDraws
	}
	for _, ag := range t.Agents {
		p.modelOf[ag.Name] = ag.Model
	}
	if t.IsToy() {
		p.transcripts = t.Toy.Task
	}
	return p
}
