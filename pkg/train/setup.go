// Package train is the GRPO / Dr. MAS training loop: rollout → score → normalize → clipped policy
// update per model, with per-agent gradient norms, metrics, checkpoints and resume.
//
// One iteration, in the order the code runs it (iteration.go): sample a batch of tasks; the
// orchestra runs group_size rollouts of each through the policies; pkg/normalize turns the calls'
// scores into advantages; each model group then takes ppo_mini_update_num × ppo_epochs AdamW steps
// on the clipped loss of its agents' calls (update.go), measuring each agent's gradient norm.
package train

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
	"github.com/drmas/drmas/pkg/env/toy"
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
}

// Trainer holds everything a run needs between iterations.
type Trainer struct {
	cfg    *config.Config
	opt    Options
	dir    string
	orch   env.Orchestra
	retr   env.Retriever
	router policy.Router
	models []*modelState // sorted by id
	byID   map[string]*modelState
	agents map[string]config.AgentConfig
	norm   normalize.Options
	train  []env.Task
	val    []env.EvalSet
	step   int // last completed iteration

	// injectNonfinite, set by tests, makes the named model's next gradient non-finite.
	injectNonfinite func(model string, iteration int) bool
}

// modelState is one model group: the weights, their optimizer and the agents that train them.
type modelState struct {
	id      string
	cfg     config.ModelConfig
	pol     *policy.Policy
	ref     *policy.Policy // frozen reference for the KL penalty (nil when off)
	names   []string
	params  []*ts.Tensor
	opt     *AdamW
	agents  []string // sorted
	horizon float64  // max_new_tokens over its agents (seq-mean-token-sum-norm)
	streak  int      // non-finite steps in a row
}

// New prepares a run: data, orchestra, models and optimizers, resuming from the latest checkpoint when
// asked. Call it from an ordinary goroutine (it enters the torch thread itself).
func New(ctx context.Context, cfg *config.Config, opt Options) (*Trainer, error) {
	t := &Trainer{cfg: cfg, opt: opt, dir: cfg.Run.Dir, byID: map[string]*modelState{}, agents: map[string]config.AgentConfig{}}
	for _, a := range cfg.Agents {
		t.agents[a.Name] = a
	}
	var err error
	if t.norm, err = normOptions(cfg.Algorithm.Normalization); err != nil {
		return nil, err
	}
	resumeFrom, err := t.prepareDir()
	if err != nil {
		return nil, err
	}
	if err := t.loadData(); err != nil {
		return nil, err
	}
	if t.retr, err = newRetriever(cfg); err != nil {
		return nil, err
	}
	if t.orch, err = env.NewOrchestra(cfg.Orchestra, cfg.EnvAgents(), t.retr); err != nil {
		return nil, err
	}
	err = torch.Do(func() error {
		torch.SetThreads(cfg.Run.Threads)
		torch.ManualSeed(cfg.Run.Seed)
		return t.buildModels(resumeFrom)
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
	return t, nil
}

// Close releases the retriever (the tensors go with the process).
func (t *Trainer) Close() {
	if c, ok := t.retr.(io.Closer); ok {
		_ = c.Close()
	}
}

// Step returns the last completed iteration.
func (t *Trainer) Step() int { return t.step }

func normOptions(n config.NormalizationConfig) (normalize.Options, error) {
	var o normalize.Options
	if n.Preset != "" {
		p, err := normalize.Preset(n.Preset)
		if err != nil {
			return o, fmt.Errorf("algorithm.normalization: %w", err)
		}
		o = p
	} else {
		o = normalize.DrMAS()
	}
	if n.Mean != "" {
		o.Mean = n.Mean
	}
	if n.Std != "" {
		o.Std = n.Std
	}
	if n.Weighting != "" {
		o.Weighting = n.Weighting
	}
	o.Eps = n.Eps
	o.Unbiased = !n.PopulationStd
	o.MinStd = n.MinStd
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("algorithm.normalization: %w", err)
	}
	return o, nil
}

// prepareDir checks run.dir: a fresh run needs it empty (or --force); --resume needs a checkpoint.
// It returns the checkpoint to resume from ("" for a fresh start).
func (t *Trainer) prepareDir() (string, error) {
	held := false
	if entries, err := os.ReadDir(t.dir); err == nil && len(entries) > 0 {
		held = true
	}
	switch {
	case t.opt.Resume:
		ck, err := latestCheckpoint(t.dir)
		if err != nil {
			return "", err
		}
		if ck == "" {
			log.Warn().Str("dir", t.dir).Msg("--resume: no checkpoint in the run folder yet; starting from the beginning")
			if err := os.RemoveAll(t.dir); err != nil {
				return "", err
			}
		}
		if err := os.MkdirAll(t.dir, 0o755); err != nil {
			return "", err
		}
		return ck, nil
	case held && !t.opt.Force:
		return "", fmt.Errorf("%w: %s (use --resume to continue it or --force to start over)", ErrRunExists, t.dir)
	case held:
		log.Warn().Str("dir", t.dir).Msg("--force: deleting the previous run")
		if err := os.RemoveAll(t.dir); err != nil {
			return "", err
		}
	}
	return "", os.MkdirAll(t.dir, 0o755)
}

func (t *Trainer) loadData() error {
	c := t.cfg
	if c.IsToy() {
		var err error
		if t.train, err = toy.Tasks(c.Toy, toy.Train); err != nil {
			return err
		}
		val, err := toy.Tasks(c.Toy, toy.Val)
		if err != nil {
			return err
		}
		t.val = []env.EvalSet{{Name: c.Toy.Task, Tasks: limit(val, c.Run.ValLimit)}}
		return nil
	}
	opts := dataset.Options{Fields: dataset.Fields(c.Data.Fields), Shape: dataset.Shape(c.Data.Shape), Limit: c.Data.Limit}
	var err error
	if t.train, err = dataset.Load(c.Data.Train, opts); err != nil {
		return fmt.Errorf("data.train: %w", err)
	}
	for i, p := range c.Data.Val {
		tasks, err := dataset.Load(p, opts)
		if err != nil {
			return fmt.Errorf("data.val[%d]: %w", i, err)
		}
		name := strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))
		t.val = append(t.val, env.EvalSet{Name: name, Tasks: limit(tasks, c.Run.ValLimit)})
	}
	return nil
}

func limit(tasks []env.Task, n int) []env.Task {
	if n > 0 && len(tasks) > n {
		return tasks[:n]
	}
	return tasks
}

func newRetriever(c *config.Config) (env.Retriever, error) {
	r := c.Retriever
	switch r.Type {
	case "", "none":
		return nil, nil
	case "facts":
		return env.FactRetriever{}, nil
	}
	ret, err := retriever.New(retriever.Config{Type: r.Type, Corpus: r.Corpus, IndexDir: r.IndexDir, URL: r.URL,
		Timeout: r.Timeout, Retries: r.Retries})
	if err != nil {
		return nil, fmt.Errorf("retriever: %w", err)
	}
	return ret, nil
}

// buildModels creates or loads every model (from the checkpoint when resuming), on the torch thread.
func (t *Trainer) buildModels(resumeFrom string) error {
	c := t.cfg
	t.router = policy.Router{}
	for _, mc := range c.Models {
		pol, err := loadPolicy(mc, t.opt.Device, c.Run.Seed, modelDir(resumeFrom, mc.ID))
		if err != nil {
			return err
		}
		ms := newModelState(c, mc, pol)
		m := pol.Model
		lr := mc.Optim.LR
		if len(ms.agents) == 1 {
			if o := t.agents[ms.agents[0]].Train.LR; o != nil {
				lr = *o
			}
		}
		o := mc.Optim
		ms.opt = NewAdamW(ms.names, ms.params, lr, o.Betas[0], o.Betas[1], o.Eps, o.WeightDecay, o.WarmupSteps)
		t.models = append(t.models, ms)
		t.byID[mc.ID] = ms
		t.router[mc.ID] = ms.pol
		log.Info().Str("model", mc.ID).Str("type", m.Config.ModelType).Int64("params", m.Config.NumParams()).
			Str("device", torch.DeviceString(m.Device())).Str("dtype", mc.DType).Strs("agents", ms.agents).Msg("model ready")
	}
	sort.Slice(t.models, func(i, j int) bool { return t.models[i].id < t.models[j].id })
	return nil
}

// newModelState gathers a model group: its policy's parameters, its agents (sorted) and their
// response horizon.
func newModelState(c *config.Config, mc config.ModelConfig, pol *policy.Policy) *modelState {
	ms := &modelState{id: mc.ID, cfg: mc, pol: pol}
	for _, a := range c.Agents {
		if a.Model == mc.ID {
			ms.agents = append(ms.agents, a.Name)
			ms.horizon = max(ms.horizon, float64(a.Sampling.Resolve().MaxNewTokens))
		}
	}
	sort.Strings(ms.agents)
	for _, p := range pol.Model.Parameters() {
		ms.names = append(ms.names, p.Name)
		ms.params = append(ms.params, p.T)
	}
	return ms
}

// initConfig turns a config's `init:` section into a Hugging Face config for a random model.
func initConfig(in config.InitConfig, tokVocab int) (policy.Config, error) {
	vocab := in.VocabSize
	if vocab == 0 {
		vocab = tokVocab
	}
	inter := in.IntermediateSize
	if inter == 0 {
		inter = 4 * in.HiddenSize
	}
	kv := in.NumKeyValueHeads
	if kv == 0 {
		kv = in.NumAttentionHeads
	}
	raw := fmt.Sprintf(`{"model_type": %q, "hidden_size": %d, "intermediate_size": %d, "num_hidden_layers": %d,
		"num_attention_heads": %d, "num_key_value_heads": %d, "vocab_size": %d, "rope_theta": %g,
		"tie_word_embeddings": %t, "max_position_embeddings": %d, "initializer_range": %g}`,
		in.ModelType, in.HiddenSize, inter, in.NumHiddenLayers, in.NumAttentionHeads, kv, vocab, in.RopeTheta,
		in.TieWordEmbeddings, in.MaxPosition, in.InitializerRange)
	return policy.ParseConfig([]byte(raw))
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
		if !t.usesKL(ms) {
			continue
		}
		ref, err := ms.pol.Model.Clone()
		if err != nil {
			return fmt.Errorf("model %s: KL reference: %w", ms.id, err)
		}
		if ms.ref, err = policy.NewPolicy(ms.id+"-ref", ref, ms.pol.Tok, ms.pol.Chat); err != nil {
			return err
		}
	}
	return nil
}

func (t *Trainer) usesKL(ms *modelState) bool {
	for _, a := range ms.agents {
		if t.coefs(a).kl > 0 {
			return true
		}
	}
	return false
}

// agentCoefs are the loss coefficients in force for one agent's calls.
type agentCoefs struct {
	clipLow, clipHigh, entropy, kl float64
	microBatch                     int
}

func (t *Trainer) coefs(agent string) agentCoefs {
	al := t.cfg.Algorithm
	c := agentCoefs{clipLow: al.ClipRatioLow, clipHigh: al.ClipRatioHigh, entropy: al.EntropyCoef, kl: al.KL.Coef, microBatch: al.MicroBatchSize}
	tr := t.agents[agent].Train
	if tr.ClipRatioLow != nil {
		c.clipLow = *tr.ClipRatioLow
	}
	if tr.ClipRatioHigh != nil {
		c.clipHigh = *tr.ClipRatioHigh
	}
	if tr.EntropyCoef != nil {
		c.entropy = *tr.EntropyCoef
	}
	if tr.KLCoef != nil {
		c.kl = *tr.KLCoef
	}
	if tr.MicroBatchSize > 0 {
		c.microBatch = tr.MicroBatchSize
	}
	return c
}

// ErrRunExists is returned when run.dir holds a run and neither --resume nor --force was given.
var ErrRunExists = errors.New("run folder already holds a run")
