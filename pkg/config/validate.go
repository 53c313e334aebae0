package config

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/policy"
)

// Allowed values of enumerated keys.
var (
	DTypes       = []string{"float32", "bfloat16", "float16"}
	ModelTypes   = policy.ModelTypes() // the model families pkg/policy registers
	LossAggModes = []string{"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
	KLTypes      = []string{"k1", "k2", "k3", "low_var_kl"}
	Retrievers   = []string{"embedded", "http", "facts", "none"}
)

var deviceRE = regexp.MustCompile(`^(|auto|cpu|cuda|cuda:\d+)$`)

// Validate checks every section and reports each problem with its key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}
	positive := func(key string, v int) {
		if v < 1 {
			bad(key, "must be ≥ 1 (got %d)", v)
		}
	}
	nonNeg := func(key string, v int) {
		if v < 0 {
			bad(key, "must be ≥ 0 (got %d)", v)
		}
	}
	oneOf := func(key, v string, allowed []string) {
		if !slices.Contains(allowed, v) {
			bad(key, "must be one of %s (got %q)", strings.Join(allowed, ", "), v)
		}
	}

	r := c.Run
	if r.Dir == "" {
		bad("run.dir", "required")
	}
	positive("run.steps", r.Steps)
	positive("run.val_k", r.ValK)
	for k, v := range map[string]int{"run.save_every": r.SaveEvery, "run.keep_last": r.KeepLast,
		"run.test_freq": r.TestFreq, "run.dump_every": r.DumpEvery, "run.threads": r.Threads,
		"run.val_limit": r.ValLimit, "run.max_minutes": r.MaxMinutes} {
		nonNeg(k, v)
	}

	shared := map[string]int{}
	for _, a := range c.Agents {
		shared[a.Model]++
	}
	if len(c.Models) == 0 {
		bad("models", "at least one model is required")
	}
	ids := map[string]int{}
	for i, m := range c.Models {
		key := fmt.Sprintf("models[%d]", i)
		if m.ID == "" {
			bad(key+".id", "required")
		} else if j, dup := ids[m.ID]; dup {
			bad(key+".id", "%q already used by models[%d]", m.ID, j)
		} else {
			ids[m.ID] = i
		}
		oneOf(key+".dtype", m.DType, DTypes)
		if !deviceRE.MatchString(m.Device) {
			bad(key+".device", "must be auto, cpu, cuda or cuda:N (got %q)", m.Device)
		}
		if m.Path == "" {
			if m.Tokenizer == "" {
				bad(key+".tokenizer", "required when path is empty (a random model needs a tokenizer.json)")
			}
			in := m.Init
			oneOf(key+".init.model_type", in.ModelType, ModelTypes)
			positive(key+".init.hidden_size", in.HiddenSize)
			positive(key+".init.num_hidden_layers", in.NumHiddenLayers)
			positive(key+".init.num_attention_heads", in.NumAttentionHeads)
			nonNeg(key+".init.num_key_value_heads", in.NumKeyValueHeads)
			nonNeg(key+".init.vocab_size", in.VocabSize)
			nonNeg(key+".init.intermediate_size", in.IntermediateSize)
			if in.NumAttentionHeads > 0 && in.HiddenSize%in.NumAttentionHeads != 0 {
				bad(key+".init.hidden_size", "%d is not a multiple of num_attention_heads %d", in.HiddenSize, in.NumAttentionHeads)
			}
			if kv := in.NumKeyValueHeads; kv > 0 && in.NumAttentionHeads%kv != 0 {
				bad(key+".init.num_key_value_heads", "%d does not divide num_attention_heads %d", kv, in.NumAttentionHeads)
			}
			if in.RopeTheta <= 0 {
				bad(key+".init.rope_theta", "must be > 0 (got %g)", in.RopeTheta)
			}
			if in.InitializerRange <= 0 {
				bad(key+".init.initializer_range", "must be > 0 (got %g)", in.InitializerRange)
			}
		}
		o := m.Optim
		if o.LR <= 0 {
			bad(key+".optim.lr", "must be > 0 (got %g)", o.LR)
		}
		if len(o.Betas) != 2 || o.Betas[0] < 0 || o.Betas[0] >= 1 || o.Betas[1] < 0 || o.Betas[1] >= 1 {
			bad(key+".optim.betas", "want two values in [0, 1), got %v", o.Betas)
		}
		if o.Eps <= 0 {
			bad(key+".optim.eps", "must be > 0 (got %g)", o.Eps)
		}
		if o.WeightDecay < 0 {
			bad(key+".optim.weight_decay", "must be ≥ 0 (got %g)", o.WeightDecay)
		}
		nonNeg(key+".optim.warmup_steps", o.WarmupSteps)
		if o.GradClip < 0 {
			bad(key+".optim.grad_clip", "must be ≥ 0, 0 = off (got %g)", o.GradClip)
		}
		if m.ID != "" && shared[m.ID] == 0 && len(c.Agents) > 0 {
			bad(key+".id", "model %q is not used by any agent", m.ID)
		}
	}

	if err := env.ValidateAgents(c.EnvAgents()); err != nil {
		errs = append(errs, err)
	}
	for i, a := range c.Agents {
		key := fmt.Sprintf("agents[%d]", i)
		if _, ok := ids[a.Model]; !ok {
			bad(key+".model", "unknown model %q (models: %s)", a.Model, strings.Join(sortedKeys(ids), ", "))
		}
		t := a.Train
		if t.LR != nil {
			if *t.LR <= 0 {
				bad(key+".train.lr", "must be > 0 (got %g)", *t.LR)
			} else if shared[a.Model] > 1 {
				bad(key+".train.lr", "model %q is shared with other agents, which use one optimizer: set models[].optim.lr instead", a.Model)
			}
		}
		for k, p := range map[string]*float64{"entropy_coef": t.EntropyCoef, "kl_coef": t.KLCoef,
			"clip_ratio_low": t.ClipRatioLow, "clip_ratio_high": t.ClipRatioHigh} {
			if p != nil && *p < 0 {
				bad(key+".train."+k, "must be ≥ 0 (got %g)", *p)
			}
		}
		nonNeg(key+".train.micro_batch_size", t.MicroBatchSize)
	}

	if err := c.Orchestra.Validate(); err != nil {
		errs = append(errs, err)
	} else if c.Orchestra.Type != "flow" {
		roles := env.Roles(c.Orchestra.Type)
		names := map[string]bool{}
		for i, a := range c.Agents {
			names[a.Name] = true
			if a.Name != "" && !slices.Contains(roles, a.Name) {
				bad(fmt.Sprintf("agents[%d].name", i), "%q is not a role of the %s orchestra (roles: %s)", a.Name, c.Orchestra.Type, strings.Join(roles, ", "))
			}
		}
		for _, role := range roles {
			if !names[role] {
				bad("agents", "the %s orchestra needs an agent named %q", c.Orchestra.Type, role)
			}
		}
	}

	if c.IsToy() {
		if err := c.Toy.Validate(); err != nil {
			errs = append(errs, err)
		}
		if c.Data.Train != "" || len(c.Data.Val) > 0 {
			bad("data", "a toy task (toy.task) generates its own data: leave data.train and data.val empty")
		}
	} else {
		if c.Data.Train == "" {
			bad("data.train", "required (a JSONL or Parquet file), or set toy.task for a generated toy task")
		}
		if c.Data.Shape != "" {
			oneOf("data.shape", c.Data.Shape, []string{"auto", "gsm8k", "math", "qa", "plain"})
		}
		nonNeg("data.limit", c.Data.Limit)
	}

	rt := c.Retriever
	if rt.Type != "" {
		oneOf("retriever.type", rt.Type, Retrievers)
	}
	usesSearch := c.Orchestra.Type == "search" || c.Orchestra.Type == "flow"
	switch {
	case c.Orchestra.Type == "search" && (rt.Type == "" || rt.Type == "none"):
		bad("retriever.type", "the search orchestra needs a retriever: embedded, http or facts")
	case rt.Type == "embedded" && rt.Corpus == "":
		bad("retriever.corpus", "required for the embedded retriever (a JSONL file of {\"id\", \"contents\"})")
	case rt.Type == "http" && rt.URL == "":
		bad("retriever.url", "required for the http retriever (e.g. http://127.0.0.1:8000/retrieve)")
	case rt.Type == "facts" && !c.IsToy():
		bad("retriever.type", "facts retrieves from a toy task's own facts: set toy.task, or use embedded or http")
	case rt.Type != "" && rt.Type != "none" && !usesSearch:
		bad("retriever.type", "the %s orchestra does not search: remove the retriever section", c.Orchestra.Type)
	}
	if rt.Timeout <= 0 {
		bad("retriever.timeout", "must be > 0 (got %s)", rt.Timeout)
	}
	positive("retriever.retries", rt.Retries)

	a := c.Algorithm
	n := a.Normalization
	if n.Preset != "" {
		oneOf("algorithm.normalization.preset", n.Preset, []string{"grpo", "drmas"})
	}
	if n.Preset == "" && (n.Mean == "" || n.Std == "") {
		bad("algorithm.normalization", "name a preset (grpo or drmas) or set both mean and std")
	}
	if n.Mean != "" {
		oneOf("algorithm.normalization.mean", n.Mean, []string{"global", "agent"})
	}
	if n.Std != "" {
		oneOf("algorithm.normalization.std", n.Std, []string{"global", "agent", "none"})
	}
	if n.Weighting != "" {
		oneOf("algorithm.normalization.weighting", n.Weighting, []string{"step", "trajectory"})
	}
	if n.Eps <= 0 {
		bad("algorithm.normalization.eps", "must be > 0 (got %g)", n.Eps)
	}
	if n.MinStd < 0 {
		bad("algorithm.normalization.min_std", "must be ≥ 0 (got %g)", n.MinStd)
	}
	positive("algorithm.group_size", a.GroupSize)
	positive("algorithm.batch_size", a.BatchSize)
	positive("algorithm.ppo_mini_update_num", a.PPOMiniUpdateNum)
	positive("algorithm.ppo_epochs", a.PPOEpochs)
	positive("algorithm.micro_batch_size", a.MicroBatchSize)
	positive("algorithm.max_nonfinite_steps", a.MaxNonfiniteSteps)
	if a.ClipRatioLow < 0 || a.ClipRatioLow >= 1 {
		bad("algorithm.clip_ratio_low", "must be in [0, 1) (got %g)", a.ClipRatioLow)
	}
	if a.ClipRatioHigh < 0 {
		bad("algorithm.clip_ratio_high", "must be ≥ 0 (got %g)", a.ClipRatioHigh)
	}
	oneOf("algorithm.loss_agg_mode", a.LossAggMode, LossAggModes)
	oneOf("algorithm.kl.type", a.KL.Type, KLTypes)
	if a.KL.Coef < 0 {
		bad("algorithm.kl.coef", "must be ≥ 0 (got %g)", a.KL.Coef)
	}
	if a.EntropyCoef < 0 {
		bad("algorithm.entropy_coef", "must be ≥ 0 (got %g)", a.EntropyCoef)
	}

	w := c.Warmup
	nonNeg("warmup.steps", w.Steps)
	positive("warmup.batch_size", w.BatchSize)
	if w.Steps > 0 && w.LR <= 0 {
		bad("warmup.lr", "must be > 0 (got %g)", w.LR)
	}
	if w.Steps > 0 && !c.IsToy() {
		bad("warmup.steps", "the format warm-up uses a toy task's demonstrations: set toy.task or warmup.steps: 0")
	}

	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return joinLine(errs)
}

// joinLine joins errors on one line.
func joinLine(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	var parts []string
	for _, e := range errs {
		parts = append(parts, strings.ReplaceAll(e.Error(), "\n", "; "))
	}
	return errors.New(strings.Join(parts, "; "))
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
