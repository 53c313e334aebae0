package config

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
)

// Allowed values of enumerated keys. The names an implementation stands behind are registered by the
// package that implements them (a choice.Set or a list of its own) and asked here, so this package
// lists none of them: normalize (estimators), env (orchestras), retriever (retriever types), engine
// (rollout engines), dataset (data shapes), and, libtorch-free on behalf of pkg/train and pkg/policy,
// pkg/train/algo (loss modes, KL types, guard actions) and pkg/arch (model families, dtypes).
// The remaining lists are settings this package's own keys define.
var (
	DTypes         = arch.DTypeNames()
	deviceRE       = regexp.MustCompile(`^(|auto|cpu|cuda|cuda:\d+)$`)
	maxRetrieverTO = 3600.0 // seconds
)

// Validate checks every section and reports each problem with its key, on one line.
func (c *Config) Validate() error {
	var ck choice.Problems
	c.checkRun(&ck)
	ids := c.checkModels(&ck)
	c.checkAgents(&ck, ids)
	c.checkOrchestra(&ck)
	c.checkData(&ck)
	c.checkRetriever(&ck)
	c.checkReward(&ck)
	c.checkAlgorithm(&ck)
	c.checkWarmup(&ck)
	ck.Add(c.Dist.Validate("dist"))
	ck.Add(c.Tools.Validate("tools"))
	if len(ck.List()) == 0 {
		return nil
	}
	return errors.New(strings.Join(ck.List(), "; "))
}

// Warnings lists settings that are valid but probably not what the user wants.
func (c *Config) Warnings() []string {
	var out []string
	if c.Algorithm.GroupSize == 1 {
		out = append(out, "algorithm.group_size is 1: every group has one rollout, so its advantage is its raw score "+
			"(mean 0, std 1): there is no baseline and GRPO / Dr. MAS reduce to REINFORCE without one; use ≥ 2")
	}
	if cc := c.Algorithm.ClipRatioC; cc == 1 {
		out = append(out, "algorithm.clip_ratio_c is 1: the dual clip is off")
	}
	for i, m := range c.Models {
		if !m.IsAdapter() {
			continue
		}
		var outer []string
		for _, t := range m.LoRA.TargetModules {
			if t == arch.LoRAEmbed || t == arch.LoRAHead {
				outer = append(outer, t)
			}
		}
		for _, b := range c.Models {
			if e := b.Rollout.Engine; b.ID == m.Base && len(outer) > 0 && (e == engine.VLLM || e == engine.SGLang) {
				out = append(out, fmt.Sprintf("models[%d].lora.target_modules names %s and its base's rollouts run on %s: "+
					"engines' support of LoRA on embed_tokens and lm_head varies by version (vLLM has refused it for Qwen2/Qwen3); "+
					"drmas serve supports it; check yours, or target the projections only (docs/lora.md)", i, strings.Join(outer, " and "), e))
			}
		}
	}
	return out
}

func (c *Config) checkRun(ck *choice.Problems) {
	r := c.Run
	if r.Dir == "" {
		ck.Bad("run.dir", "required")
	}
	ck.AtLeast("run.steps", r.Steps, 1)
	ck.IntIn("run.val_k", r.ValK, 1, 1<<16)
	for k, v := range map[string]int{"run.save_every": r.SaveEvery, "run.keep_last": r.KeepLast,
		"run.test_freq": r.TestFreq, "run.val_limit": r.ValLimit,
		"run.max_minutes": r.MaxMinutes} {
		ck.AtLeast(k, v, 0)
	}
	ck.IntIn("run.threads", r.Threads, 0, 1<<12)
	ck.Add(r.Config.Validate("run"))
}

// checkModels checks the models list and returns the index of each id.
func (c *Config) checkModels(ck *choice.Problems) map[string]int {
	used := map[string]int{}
	for _, a := range c.Agents {
		used[a.Model]++
	}
	if len(c.Models) == 0 {
		ck.Bad("models", "at least one model is required")
	}
	ids := map[string]int{}
	for i, m := range c.Models {
		key := fmt.Sprintf("models[%d]", i)
		if m.ID == "" {
			ck.Bad(key+".id", "required")
		} else if j, dup := ids[m.ID]; dup {
			ck.Bad(key+".id", "%q already used by models[%d]", m.ID, j)
		} else {
			ids[m.ID] = i
		}
		if m.ID != "" && used[m.ID] == 0 && len(c.Agents) > 0 && !c.IsFrozenBase(m.ID) {
			ck.Bad(key+".id", "model %q is not used by any agent", m.ID)
		}
		ck.IntIn(key+".max_tokens_per_micro_batch", m.MaxTokensPerMicroBatch, 0, 1<<30)
		if m.IsAdapter() {
			c.checkAdapter(ck, key, m)
			continue
		}
		ck.OneOf(key+".dtype", m.DType, DTypes)
		if !deviceRE.MatchString(m.Device) {
			ck.Bad(key+".device", "must be auto, cpu, cuda or cuda:N (got %q)", m.Device)
		}
		if m.Path == "" {
			if m.Tokenizer == "" {
				ck.Bad(key+".tokenizer", "required when path is empty (a random model needs a tokenizer.json)")
			}
			checkInit(ck, key+".init", m.Init)
		}
		checkOptim(ck, key+".optim", m.Optim)
		ck.Add(m.Rollout.Validate(key + ".rollout"))
	}
	return ids
}

// checkAdapter checks an adapter entry (base: set): its base must be a full model entry, and its
// lora settings a shape pkg/policy trains. Its rollout engine, optimizer and checkpointing are
// its own; its weights, tokenizer, dtype and device are the base's.
func (c *Config) checkAdapter(ck *choice.Problems, key string, m ModelConfig) {
	switch b, ok := c.ModelByID(m.Base); {
	case m.Base == m.ID:
		ck.Bad(key+".base", "%q is the entry itself (want another model entry's id)", m.Base)
	case !ok:
		ck.Bad(key+".base", "unknown model %q (models: %s)", m.Base, strings.Join(c.modelIDs(), ", "))
	case b.IsAdapter():
		ck.Bad(key+".base", "model %q is itself an adapter (on %q): an adapter's base must be a full model", m.Base, b.Base)
	}
	if m.Path != "" {
		ck.Bad(key+".path", "an adapter has no weights of its own (set lora.path to start from a PEFT adapter folder)")
	}
	if m.Tokenizer != "" {
		ck.Bad(key+".tokenizer", "an adapter uses its base's tokenizer")
	}
	l := m.LoRA
	ck.IntIn(key+".lora.rank", l.Rank, 1, 1<<12)
	ck.Positive(key+".lora.alpha", l.Alpha)
	if l.Dropout != 0 {
		ck.Bad(key+".lora.dropout", "%v: only 0 is supported (drmas trains LoRA adapters without dropout)", l.Dropout)
	}
	if len(l.TargetModules) == 0 {
		ck.Bad(key+".lora.target_modules", "none given (want %s or some of %s)", arch.LoRAAllLinear, strings.Join(arch.LoRAModules, ", "))
	}
	for i, t := range l.TargetModules {
		if t != arch.LoRAAllLinear && !slices.Contains(arch.LoRAModules, t) {
			ck.Bad(fmt.Sprintf("%s.lora.target_modules[%d]", key, i), "%q is not a module an adapter can target (want %s or some of %s)", t, arch.LoRAAllLinear, strings.Join(arch.LoRAModules, ", "))
		}
	}
	checkOptim(ck, key+".optim", m.Optim)
	ck.Add(m.Rollout.Validate(key + ".rollout"))
	if m.Rollout.Engine != engine.Local {
		ck.Bad(key+".rollout.engine", "%s: an adapter's rollouts run where its base's do (set rollout on model %q: the engine serves the base and loads every adapter on it)", m.Rollout.Engine, m.Base)
	}
}

// modelIDs lists the model entries' ids, sorted.
func (c *Config) modelIDs() []string {
	var out []string
	for _, m := range c.Models {
		out = append(out, m.ID)
	}
	sort.Strings(out)
	return out
}

// checkInit checks the architecture of a randomly initialised model.
func checkInit(ck *choice.Problems, key string, in InitConfig) {
	ck.Registered(key+".model_type", in.ModelType, arch.Names)
	for k, v := range map[string]int{"hidden_size": in.HiddenSize, "num_hidden_layers": in.NumHiddenLayers,
		"num_attention_heads": in.NumAttentionHeads, "max_position_embeddings": in.MaxPosition} {
		ck.IntIn(key+"."+k, v, 1, arch.MaxSizes[k])
	}
	for k, v := range map[string]int{"vocab_size": in.VocabSize, "intermediate_size": in.IntermediateSize} {
		ck.IntIn(key+"."+k, v, 0, arch.MaxSizes[k]) // 0 = derived
	}
	ck.IntIn(key+".num_key_value_heads", in.NumKeyValueHeads, 0, arch.MaxSizes["num_attention_heads"])
	if in.NumAttentionHeads > 0 && in.HiddenSize%in.NumAttentionHeads != 0 {
		ck.Bad(key+".hidden_size", "%d is not a multiple of num_attention_heads %d", in.HiddenSize, in.NumAttentionHeads)
	}
	if kv := in.NumKeyValueHeads; kv > 0 && in.NumAttentionHeads%kv != 0 {
		ck.Bad(key+".num_key_value_heads", "%d does not divide num_attention_heads %d", kv, in.NumAttentionHeads)
	}
	ck.Positive(key+".rope_theta", in.RopeTheta)
	ck.Positive(key+".initializer_range", in.InitializerRange)
}

func checkOptim(ck *choice.Problems, key string, o OptimConfig) {
	ck.Positive(key+".lr", o.LR)
	if len(o.Betas) != 2 || !(o.Betas[0] >= 0 && o.Betas[0] < 1) || !(o.Betas[1] >= 0 && o.Betas[1] < 1) {
		ck.Bad(key+".betas", "want two values in [0, 1), got %v", o.Betas)
	}
	ck.Positive(key+".eps", o.Eps)
	ck.NonNeg(key+".weight_decay", o.WeightDecay)
	ck.AtLeast(key+".warmup_steps", o.WarmupSteps, 0)
	ck.NonNeg(key+".grad_clip", o.GradClip)
	ck.Registered(key+".offload", o.Offload, algo.OffloadModes)
}

// checkAgents checks the agents list against the models (env owns the agents' own settings, and
// llm.Sampling.Check the sampling rules).
func (c *Config) checkAgents(ck *choice.Problems, ids map[string]int) {
	ck.Add(env.ValidateAgents(c.EnvAgents()))
	shared := map[string]int{}
	for _, a := range c.Agents {
		shared[a.Model]++
	}
	for i, a := range c.Agents {
		key := fmt.Sprintf("agents[%d]", i)
		mi, ok := ids[a.Model]
		if ok && c.Models[mi].IsAdapter() {
			if b, found := c.ModelByID(c.Models[mi].Base); found {
				mi = ids[b.ID] // the base's architecture bounds the adapter's sequences
			}
		}
		if !ok {
			ck.Bad(key+".model", "unknown model %q (models: %s)", a.Model, strings.Join(sortedKeys(ids), ", "))
		} else if c.IsFrozenBase(a.Model) {
			ck.Bad(key+".model", "model %q is the frozen base of adapters %s: name one of them (or a model of the agent's own)", a.Model, strings.Join(c.AdaptersOf(a.Model), ", "))
		} else if m := c.Models[mi]; m.Path == "" {
			if n, limit := a.Sampling.Resolve().MaxNewTokens, m.Init.MaxPosition; n >= limit && limit > 0 {
				ck.Bad(key+".sampling.max_new_tokens", "%d leaves no room for a prompt within model %q's max_position_embeddings %d", n, a.Model, limit)
			}
		}
		t := a.Train
		if t.LR != nil {
			ck.Positive(key+".train.lr", *t.LR)
			if shared[a.Model] > 1 {
				ck.Bad(key+".train.lr", "model %q is shared with other agents, which use one optimizer: set models[].optim.lr instead", a.Model)
			}
		}
		if t.GradClip != nil {
			ck.NonNeg(key+".train.grad_clip", *t.GradClip)
			if shared[a.Model] > 1 {
				ck.Bad(key+".train.grad_clip", "model %q is shared with other agents, which take one clipped optimizer step: set models[].optim.grad_clip instead, or algorithm.guard to clip one agent's share", a.Model)
			}
		}
		for k, p := range map[string]*float64{"entropy_coef": t.EntropyCoef, "kl_coef": t.KLCoef, "clip_ratio_high": t.ClipRatioHigh} {
			if p != nil {
				ck.NonNeg(key+".train."+k, *p)
			}
		}
		if t.ClipRatioLow != nil {
			ck.Fraction(key+".train.clip_ratio_low", *t.ClipRatioLow, false)
		}
		ck.IntIn(key+".train.micro_batch_size", t.MicroBatchSize, 0, 1<<16)
	}
}

// checkOrchestra checks the orchestra section and that the agents play its roles.
func (c *Config) checkOrchestra(ck *choice.Problems) {
	if err := c.Orchestra.Validate(); err != nil {
		ck.Add(err)
		return
	}
	roles := env.Roles(c.Orchestra.Type)
	if roles == nil { // flow: its steps name the agents
		return
	}
	names := map[string]bool{}
	for i, a := range c.Agents {
		names[a.Name] = true
		if a.Name != "" && !slices.Contains(roles, a.Name) {
			ck.Bad(fmt.Sprintf("agents[%d].name", i), "%q is not a role of the %s orchestra (roles: %s)", a.Name, c.Orchestra.Type, strings.Join(roles, ", "))
		}
	}
	for _, role := range roles {
		if !names[role] {
			ck.Bad("agents", "the %s orchestra needs an agent named %q", c.Orchestra.Type, role)
		}
	}
}

func (c *Config) checkData(ck *choice.Problems) {
	if c.IsToy() {
		ck.Add(c.Toy.Validate())
		if c.Data.Train != "" || len(c.Data.Val) > 0 {
			ck.Bad("data", "a toy task (toy.task) generates its own data: leave data.train and data.val empty")
		}
		return
	}
	if c.Data.Train == "" {
		ck.Bad("data.train", "required (a JSONL or Parquet file), or set toy.task for a generated toy task")
	}
	if c.Data.Shape != "" {
		ck.OneOf("data.shape", c.Data.Shape, dataset.Shapes)
	}
	ck.AtLeast("data.limit", c.Data.Limit, 0)
	ck.IntIn("data.max_prompt_length", c.Data.MaxPromptLength, 0, 1<<22)
}

func (c *Config) checkRetriever(ck *choice.Problems) {
	rt := c.Retriever
	if rt.Type != "" {
		ck.Registered("retriever.type", rt.Type, retriever.RunTypes)
	}
	none := rt.Type == "" || rt.Type == retriever.TypeNone
	switch use := env.OrchestraRetrieval(c.Orchestra.Type); {
	case use == env.NeedsRetriever && none:
		ck.Bad("retriever.type", "the %s orchestra needs a retriever: embedded, http or facts", c.Orchestra.Type)
	case rt.Type == retriever.TypeEmbedded && rt.Corpus == "":
		ck.Bad("retriever.corpus", "required for the embedded retriever (a JSONL file of {\"id\", \"contents\"})")
	case rt.Type == retriever.TypeHTTP && rt.URL == "":
		ck.Bad("retriever.url", "required for the http retriever (e.g. http://127.0.0.1:8000/retrieve)")
	case rt.Type == retriever.TypeHTTP:
		if err := retriever.CheckURL(rt.URL); err != nil {
			ck.Bad("retriever.url", "%v", err)
		}
	case rt.Type == retriever.TypeFacts && !c.IsToy():
		ck.Bad("retriever.type", "facts retrieves from a toy task's own facts: set toy.task, or use embedded or http")
	case !none && use == env.NoRetrieval:
		ck.Bad("retriever.type", "the %s orchestra does not search: remove the retriever section", c.Orchestra.Type)
	}
	if s := rt.Timeout.Seconds(); !(s > 0 && s <= maxRetrieverTO) {
		ck.Bad("retriever.timeout", "must be in (0s, 1h] (got %s)", rt.Timeout)
	}
	ck.IntIn("retriever.retries", rt.Retries, 1, 100)
	if s := rt.Deadline.Seconds(); !(s >= 0 && s <= 24*3600) {
		ck.Bad("retriever.deadline", "must be in [0s, 24h], 0 = retries only (got %s)", rt.Deadline)
	}
}

func (c *Config) checkAlgorithm(ck *choice.Problems) {
	a := c.Algorithm
	c.checkNormalization(ck)
	c.checkGuard(ck)
	ck.Add(c.Rollout.Validate("rollout"))
	c.checkCorrection(ck)
	for k, v := range map[string]int{"group_size": a.GroupSize, "batch_size": a.BatchSize,
		"ppo_mini_update_num": a.PPOMiniUpdateNum, "ppo_epochs": a.PPOEpochs, "micro_batch_size": a.MicroBatchSize,
		"max_nonfinite_steps": a.MaxNonfiniteSteps} {
		ck.IntIn("algorithm."+k, v, 1, 1<<16)
	}
	ck.IntIn("algorithm.max_tokens_per_micro_batch", a.MaxTokensPerMicroBatch, 0, 1<<30)
	ck.Fraction("algorithm.clip_ratio_low", a.ClipRatioLow, false)
	ck.NonNeg("algorithm.clip_ratio_high", a.ClipRatioHigh)
	if !(a.ClipRatioC >= 1) || math.IsInf(a.ClipRatioC, 0) {
		ck.Bad("algorithm.clip_ratio_c", "must be a finite number ≥ 1, as in verl (1 = dual clip off; got %g)", a.ClipRatioC)
	}
	ck.Registered("algorithm.loss_agg_mode", a.LossAggMode, algo.LossAggModes)
	ck.Registered("algorithm.kl.type", a.KL.Type, algo.KLTypes)
	ck.NonNeg("algorithm.kl.coef", a.KL.Coef)
	ck.NonNeg("algorithm.entropy_coef", a.EntropyCoef)
	kr := a.KLInReward
	ck.IntIn("algorithm.filter_groups.max_draws", c.Algorithm.FilterGroups.MaxDraws, 1, 64)
	ck.NonNeg("algorithm.kl_in_reward.coef", kr.Coef)
	ck.Registered("algorithm.kl_in_reward.type", kr.Type, algo.KLTypes)
	ck.OneOf("algorithm.kl_in_reward.controller", kr.Controller, []string{KLControllerFixed, KLControllerAdaptive})
	if kr.Controller == KLControllerAdaptive && kr.Coef > 0 {
		ck.Positive("algorithm.kl_in_reward.target", kr.Target)
		ck.Positive("algorithm.kl_in_reward.horizon", kr.Horizon)
	}
}

func (c *Config) checkWarmup(ck *choice.Problems) {
	w := c.Warmup
	ck.AtLeast("warmup.steps", w.Steps, 0)
	ck.IntIn("warmup.batch_size", w.BatchSize, 1, 1<<16)
	if w.Steps > 0 {
		ck.Positive("warmup.lr", w.LR)
		if !c.IsToy() {
			ck.Bad("warmup.steps", "the format warm-up uses a toy task's demonstrations: set toy.task or warmup.steps: 0")
		}
	}
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkReward checks the `reward:` section (pkg/judge names its keys).
func (c *Config) checkReward(ck *choice.Problems) {
	if err := c.Reward.Validate(); err != nil {
		ck.Add(err)
	}
}
