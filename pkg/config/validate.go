package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
	"github.com/drmas/drmas/pkg/replica"
	"github.com/drmas/drmas/pkg/train/algo"
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

// checker collects problems, each naming its key.
type checker struct{ errs []string }

func (c *checker) bad(key, format string, args ...any) {
	c.errs = append(c.errs, key+": "+fmt.Sprintf(format, args...))
}

// add takes the problems of a section validated elsewhere (env, toy), one per line.
func (c *checker) add(err error) { c.errs = append(c.errs, problems(err)...) }

func (c *checker) intIn(key string, v, lo, hi int) {
	if v < lo || v > hi {
		c.bad(key, "must be in [%d, %d] (got %d)", lo, hi, v)
	}
}

func (c *checker) atLeast(key string, v, lo int) {
	if v < lo {
		c.bad(key, "must be ≥ %d (got %d)", lo, v)
	}
}

// positive wants a finite number > 0.
func (c *checker) positive(key string, v float64) {
	if !(v > 0) || math.IsInf(v, 0) {
		c.bad(key, "must be a finite number > 0 (got %g)", v)
	}
}

// nonNeg wants a finite number ≥ 0.
func (c *checker) nonNeg(key string, v float64) {
	if !(v >= 0) || math.IsInf(v, 0) {
		c.bad(key, "must be a finite number ≥ 0 (got %g)", v)
	}
}

// fraction wants a number in [0, 1) (closed above when closed is true).
func (c *checker) fraction(key string, v float64, closed bool) {
	if !(v >= 0 && (v < 1 || closed && v == 1)) {
		hi := ")"
		if closed {
			hi = "]"
		}
		c.bad(key, "must be in [0, 1%s (got %g)", hi, v)
	}
}

func (c *checker) oneOf(key, v string, allowed []string) {
	if !slices.Contains(allowed, v) {
		c.bad(key, "must be one of %s (got %q)", strings.Join(allowed, ", "), v)
	}
}

// registered checks v against a registry of the implementing package.
func (c *checker) registered(key, v string, set *choice.Set) { c.oneOf(key, v, set.Names()) }

// Validate checks every section and reports each problem with its key, on one line.
func (c *Config) Validate() error {
	var ck checker
	c.checkRun(&ck)
	ids := c.checkModels(&ck)
	c.checkAgents(&ck, ids)
	c.checkOrchestra(&ck)
	c.checkData(&ck)
	c.checkRetriever(&ck)
	c.checkReward(&ck)
	c.checkAlgorithm(&ck)
	c.checkWarmup(&ck)
	c.checkDist(&ck)
	if err := c.Tools.Validate("tools"); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			ck.errs = append(ck.errs, e)
		}
	}
	sort.Strings(ck.errs)
	if len(ck.errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(ck.errs, "; "))
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

func (c *Config) checkRun(ck *checker) {
	r := c.Run
	if r.Dir == "" {
		ck.bad("run.dir", "required")
	}
	ck.atLeast("run.steps", r.Steps, 1)
	ck.intIn("run.val_k", r.ValK, 1, 1<<16)
	for k, v := range map[string]int{"run.save_every": r.SaveEvery, "run.keep_last": r.KeepLast,
		"run.test_freq": r.TestFreq, "run.dump_every": r.DumpEvery, "run.val_limit": r.ValLimit,
		"run.max_minutes": r.MaxMinutes} {
		ck.atLeast(k, v, 0)
	}
	ck.intIn("run.threads", r.Threads, 0, 1<<12)
	ck.nonNeg("run.peak_tflops", r.PeakTFLOPS)
}

// checkModels checks the models list and returns the index of each id.
func (c *Config) checkModels(ck *checker) map[string]int {
	used := map[string]int{}
	for _, a := range c.Agents {
		used[a.Model]++
	}
	if len(c.Models) == 0 {
		ck.bad("models", "at least one model is required")
	}
	ids := map[string]int{}
	for i, m := range c.Models {
		key := fmt.Sprintf("models[%d]", i)
		if m.ID == "" {
			ck.bad(key+".id", "required")
		} else if j, dup := ids[m.ID]; dup {
			ck.bad(key+".id", "%q already used by models[%d]", m.ID, j)
		} else {
			ids[m.ID] = i
		}
		if m.ID != "" && used[m.ID] == 0 && len(c.Agents) > 0 && !c.IsFrozenBase(m.ID) {
			ck.bad(key+".id", "model %q is not used by any agent", m.ID)
		}
		ck.intIn(key+".max_tokens_per_micro_batch", m.MaxTokensPerMicroBatch, 0, 1<<30)
		if m.IsAdapter() {
			c.checkAdapter(ck, key, m)
			continue
		}
		ck.oneOf(key+".dtype", m.DType, DTypes)
		if !deviceRE.MatchString(m.Device) {
			ck.bad(key+".device", "must be auto, cpu, cuda or cuda:N (got %q)", m.Device)
		}
		if m.Path == "" {
			if m.Tokenizer == "" {
				ck.bad(key+".tokenizer", "required when path is empty (a random model needs a tokenizer.json)")
			}
			checkInit(ck, key+".init", m.Init)
		}
		checkOptim(ck, key+".optim", m.Optim)
		checkRollout(ck, key+".rollout", m.Rollout)
	}
	return ids
}

// checkAdapter checks an adapter entry (base: set): its base must be a full model entry, and its
// lora settings a shape pkg/policy trains. Its rollout engine, optimizer and checkpointing are
// its own; its weights, tokenizer, dtype and device are the base's.
func (c *Config) checkAdapter(ck *checker, key string, m ModelConfig) {
	switch b, ok := c.ModelByID(m.Base); {
	case m.Base == m.ID:
		ck.bad(key+".base", "%q is the entry itself (want another model entry's id)", m.Base)
	case !ok:
		ck.bad(key+".base", "unknown model %q (models: %s)", m.Base, strings.Join(c.modelIDs(), ", "))
	case b.IsAdapter():
		ck.bad(key+".base", "model %q is itself an adapter (on %q): an adapter's base must be a full model", m.Base, b.Base)
	}
	if m.Path != "" {
		ck.bad(key+".path", "an adapter has no weights of its own (set lora.path to start from a PEFT adapter folder)")
	}
	if m.Tokenizer != "" {
		ck.bad(key+".tokenizer", "an adapter uses its base's tokenizer")
	}
	l := m.LoRA
	ck.intIn(key+".lora.rank", l.Rank, 1, 1<<12)
	ck.positive(key+".lora.alpha", l.Alpha)
	if l.Dropout != 0 {
		ck.bad(key+".lora.dropout", "%v: only 0 is supported (drmas trains LoRA adapters without dropout)", l.Dropout)
	}
	if len(l.TargetModules) == 0 {
		ck.bad(key+".lora.target_modules", "none given (want %s or some of %s)", arch.LoRAAllLinear, strings.Join(arch.LoRAModules, ", "))
	}
	for i, t := range l.TargetModules {
		if t != arch.LoRAAllLinear && !slices.Contains(arch.LoRAModules, t) {
			ck.bad(fmt.Sprintf("%s.lora.target_modules[%d]", key, i), "%q is not a module an adapter can target (want %s or some of %s)", t, arch.LoRAAllLinear, strings.Join(arch.LoRAModules, ", "))
		}
	}
	checkOptim(ck, key+".optim", m.Optim)
	checkRollout(ck, key+".rollout", m.Rollout)
	if m.Rollout.Engine != engine.Local {
		ck.bad(key+".rollout.engine", "%s: an adapter's rollouts run where its base's do (set rollout on model %q: the engine serves the base and loads every adapter on it)", m.Rollout.Engine, m.Base)
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

// checkRollout checks a model's rollout engine section.
func checkRollout(ck *checker, key string, r RolloutConfig) {
	ck.registered(key+".engine", r.Engine, engine.Kinds)
	ck.nonNeg(key+".max_logprob_diff", r.MaxLogprobDiff)
	ck.atLeast(key+".max_batch", r.MaxBatch, 0)
	ck.nonNeg(key+".kv_tokens", float64(r.KVTokens))
	if strings.ContainsFunc(r.APIKey, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		ck.bad(key+".api_key", "must not hold spaces or control characters (it is sent as an HTTP header)")
	}
	if r.Engine == engine.Local {
		if len(r.URLs) > 0 {
			ck.bad(key+".urls", "engine local samples in-process and takes no urls (set engine: sglang, vllm, openai or managed)")
		}
		if r.APIKey != "" {
			ck.bad(key+".api_key", "engine local samples in-process and takes no api_key")
		}
		return
	}
	if len(r.CPUs) > 0 && r.Engine != engine.Managed {
		ck.bad(key+".cpus", "pins managed replicas (engine: managed) only")
	}
	if r.Engine == engine.Managed {
		if len(r.URLs) > 0 || r.APIKey != "" {
			ck.bad(key+".urls", "engine managed starts its own replicas on loopback with their own key: no urls or api_key")
		}
		ck.intIn(key+".replicas", r.Replicas, 1, 64)
		ck.atLeast(key+".threads", r.Threads, 0)
		for i, d := range r.Devices {
			if !deviceRE.MatchString(d) {
				ck.bad(fmt.Sprintf("%s.devices[%d]", key, i), "%q: want cpu, cuda or cuda:N", d)
			}
		}
		for i, c := range r.CPUs {
			if _, err := replica.ParseCPUs(c); err != nil {
				ck.bad(fmt.Sprintf("%s.cpus[%d]", key, i), "%v", err)
			}
		}
	} else if len(r.URLs) == 0 {
		ck.bad(key+".urls", "engine %s needs at least one replica URL (http://host:port)", r.Engine)
	}
	seen := map[string]int{}
	for i, u := range r.URLs {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			ck.bad(fmt.Sprintf("%s.urls[%d]", key, i), "%q is not an http(s)://host:port URL", u)
		} else if j, dup := seen[u]; dup {
			ck.bad(fmt.Sprintf("%s.urls[%d]", key, i), "%q repeats urls[%d]", u, j)
		}
		seen[u] = i
	}
	ck.atLeast(key+".max_inflight", r.MaxInflight, 1)
	if r.Timeout <= 0 {
		ck.bad(key+".timeout", "must be > 0, e.g. 5m (got %s)", r.Timeout)
	}
	ck.atLeast(key+".retries", r.Retries, 0)
}

// checkInit checks the architecture of a randomly initialised model.
func checkInit(ck *checker, key string, in InitConfig) {
	ck.registered(key+".model_type", in.ModelType, arch.Names)
	for k, v := range map[string]int{"hidden_size": in.HiddenSize, "num_hidden_layers": in.NumHiddenLayers,
		"num_attention_heads": in.NumAttentionHeads, "max_position_embeddings": in.MaxPosition} {
		ck.intIn(key+"."+k, v, 1, arch.MaxSizes[k])
	}
	for k, v := range map[string]int{"vocab_size": in.VocabSize, "intermediate_size": in.IntermediateSize} {
		ck.intIn(key+"."+k, v, 0, arch.MaxSizes[k]) // 0 = derived
	}
	ck.intIn(key+".num_key_value_heads", in.NumKeyValueHeads, 0, arch.MaxSizes["num_attention_heads"])
	if in.NumAttentionHeads > 0 && in.HiddenSize%in.NumAttentionHeads != 0 {
		ck.bad(key+".hidden_size", "%d is not a multiple of num_attention_heads %d", in.HiddenSize, in.NumAttentionHeads)
	}
	if kv := in.NumKeyValueHeads; kv > 0 && in.NumAttentionHeads%kv != 0 {
		ck.bad(key+".num_key_value_heads", "%d does not divide num_attention_heads %d", kv, in.NumAttentionHeads)
	}
	ck.positive(key+".rope_theta", in.RopeTheta)
	ck.positive(key+".initializer_range", in.InitializerRange)
}

func checkOptim(ck *checker, key string, o OptimConfig) {
	ck.positive(key+".lr", o.LR)
	if len(o.Betas) != 2 || !(o.Betas[0] >= 0 && o.Betas[0] < 1) || !(o.Betas[1] >= 0 && o.Betas[1] < 1) {
		ck.bad(key+".betas", "want two values in [0, 1), got %v", o.Betas)
	}
	ck.positive(key+".eps", o.Eps)
	ck.nonNeg(key+".weight_decay", o.WeightDecay)
	ck.atLeast(key+".warmup_steps", o.WarmupSteps, 0)
	ck.nonNeg(key+".grad_clip", o.GradClip)
	ck.registered(key+".offload", o.Offload, algo.OffloadModes)
}

// checkAgents checks the agents list against the models (env owns the agents' own settings, and
// llm.Sampling.Check the sampling rules).
func (c *Config) checkAgents(ck *checker, ids map[string]int) {
	ck.add(env.ValidateAgents(c.EnvAgents()))
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
			ck.bad(key+".model", "unknown model %q (models: %s)", a.Model, strings.Join(sortedKeys(ids), ", "))
		} else if c.IsFrozenBase(a.Model) {
			ck.bad(key+".model", "model %q is the frozen base of adapters %s: name one of them (or a model of the agent's own)", a.Model, strings.Join(c.AdaptersOf(a.Model), ", "))
		} else if m := c.Models[mi]; m.Path == "" {
			if n, limit := a.Sampling.Resolve().MaxNewTokens, m.Init.MaxPosition; n >= limit && limit > 0 {
				ck.bad(key+".sampling.max_new_tokens", "%d leaves no room for a prompt within model %q's max_position_embeddings %d", n, a.Model, limit)
			}
		}
		t := a.Train
		if t.LR != nil {
			ck.positive(key+".train.lr", *t.LR)
			if shared[a.Model] > 1 {
				ck.bad(key+".train.lr", "model %q is shared with other agents, which use one optimizer: set models[].optim.lr instead", a.Model)
			}
		}
		if t.GradClip != nil {
			ck.nonNeg(key+".train.grad_clip", *t.GradClip)
			if shared[a.Model] > 1 {
				ck.bad(key+".train.grad_clip", "model %q is shared with other agents, which take one clipped optimizer step: set models[].optim.grad_clip instead, or algorithm.guard to clip one agent's share", a.Model)
			}
		}
		for k, p := range map[string]*float64{"entropy_coef": t.EntropyCoef, "kl_coef": t.KLCoef, "clip_ratio_high": t.ClipRatioHigh} {
			if p != nil {
				ck.nonNeg(key+".train."+k, *p)
			}
		}
		if t.ClipRatioLow != nil {
			ck.fraction(key+".train.clip_ratio_low", *t.ClipRatioLow, false)
		}
		ck.intIn(key+".train.micro_batch_size", t.MicroBatchSize, 0, 1<<16)
	}
}

// checkOrchestra checks the orchestra section and that the agents play its roles.
func (c *Config) checkOrchestra(ck *checker) {
	if err := c.Orchestra.Validate(); err != nil {
		ck.add(err)
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
			ck.bad(fmt.Sprintf("agents[%d].name", i), "%q is not a role of the %s orchestra (roles: %s)", a.Name, c.Orchestra.Type, strings.Join(roles, ", "))
		}
	}
	for _, role := range roles {
		if !names[role] {
			ck.bad("agents", "the %s orchestra needs an agent named %q", c.Orchestra.Type, role)
		}
	}
}

func (c *Config) checkData(ck *checker) {
	if c.IsToy() {
		ck.add(c.Toy.Validate())
		if c.Data.Train != "" || len(c.Data.Val) > 0 {
			ck.bad("data", "a toy task (toy.task) generates its own data: leave data.train and data.val empty")
		}
		return
	}
	if c.Data.Train == "" {
		ck.bad("data.train", "required (a JSONL or Parquet file), or set toy.task for a generated toy task")
	}
	if c.Data.Shape != "" {
		ck.oneOf("data.shape", c.Data.Shape, dataset.Shapes)
	}
	ck.atLeast("data.limit", c.Data.Limit, 0)
	ck.intIn("data.max_prompt_length", c.Data.MaxPromptLength, 0, 1<<22)
}

func (c *Config) checkRetriever(ck *checker) {
	rt := c.Retriever
	if rt.Type != "" {
		ck.registered("retriever.type", rt.Type, retriever.RunTypes)
	}
	none := rt.Type == "" || rt.Type == retriever.TypeNone
	switch use := env.OrchestraRetrieval(c.Orchestra.Type); {
	case use == env.NeedsRetriever && none:
		ck.bad("retriever.type", "the %s orchestra needs a retriever: embedded, http or facts", c.Orchestra.Type)
	case rt.Type == retriever.TypeEmbedded && rt.Corpus == "":
		ck.bad("retriever.corpus", "required for the embedded retriever (a JSONL file of {\"id\", \"contents\"})")
	case rt.Type == retriever.TypeHTTP && rt.URL == "":
		ck.bad("retriever.url", "required for the http retriever (e.g. http://127.0.0.1:8000/retrieve)")
	case rt.Type == retriever.TypeHTTP:
		if err := retriever.CheckURL(rt.URL); err != nil {
			ck.bad("retriever.url", "%v", err)
		}
	case rt.Type == retriever.TypeFacts && !c.IsToy():
		ck.bad("retriever.type", "facts retrieves from a toy task's own facts: set toy.task, or use embedded or http")
	case !none && use == env.NoRetrieval:
		ck.bad("retriever.type", "the %s orchestra does not search: remove the retriever section", c.Orchestra.Type)
	}
	if s := rt.Timeout.Seconds(); !(s > 0 && s <= maxRetrieverTO) {
		ck.bad("retriever.timeout", "must be in (0s, 1h] (got %s)", rt.Timeout)
	}
	ck.intIn("retriever.retries", rt.Retries, 1, 100)
	if s := rt.Deadline.Seconds(); !(s >= 0 && s <= 24*3600) {
		ck.bad("retriever.deadline", "must be in [0s, 24h], 0 = retries only (got %s)", rt.Deadline)
	}
}

func (c *Config) checkAlgorithm(ck *checker) {
	a := c.Algorithm
	c.checkNormalization(ck)
	c.checkGuard(ck)
	ck.intIn("rollout.max_staleness", c.Rollout.MaxStaleness, 0, 16)
	c.checkCorrection(ck)
	for k, v := range map[string]int{"group_size": a.GroupSize, "batch_size": a.BatchSize,
		"ppo_mini_update_num": a.PPOMiniUpdateNum, "ppo_epochs": a.PPOEpochs, "micro_batch_size": a.MicroBatchSize,
		"max_nonfinite_steps": a.MaxNonfiniteSteps} {
		ck.intIn("algorithm."+k, v, 1, 1<<16)
	}
	ck.intIn("algorithm.max_tokens_per_micro_batch", a.MaxTokensPerMicroBatch, 0, 1<<30)
	ck.fraction("algorithm.clip_ratio_low", a.ClipRatioLow, false)
	ck.nonNeg("algorithm.clip_ratio_high", a.ClipRatioHigh)
	if !(a.ClipRatioC >= 1) || math.IsInf(a.ClipRatioC, 0) {
		ck.bad("algorithm.clip_ratio_c", "must be a finite number ≥ 1, as in verl (1 = dual clip off; got %g)", a.ClipRatioC)
	}
	ck.registered("algorithm.loss_agg_mode", a.LossAggMode, algo.LossAggModes)
	ck.registered("algorithm.kl.type", a.KL.Type, algo.KLTypes)
	ck.nonNeg("algorithm.kl.coef", a.KL.Coef)
	ck.nonNeg("algorithm.entropy_coef", a.EntropyCoef)
	kr := a.KLInReward
	ck.intIn("algorithm.filter_groups.max_draws", c.Algorithm.FilterGroups.MaxDraws, 1, 64)
	ck.nonNeg("algorithm.kl_in_reward.coef", kr.Coef)
	ck.registered("algorithm.kl_in_reward.type", kr.Type, algo.KLTypes)
	ck.oneOf("algorithm.kl_in_reward.controller", kr.Controller, []string{KLControllerFixed, KLControllerAdaptive})
	if kr.Controller == KLControllerAdaptive && kr.Coef > 0 {
		ck.positive("algorithm.kl_in_reward.target", kr.Target)
		ck.positive("algorithm.kl_in_reward.horizon", kr.Horizon)
	}
}

func (c *Config) checkWarmup(ck *checker) {
	w := c.Warmup
	ck.atLeast("warmup.steps", w.Steps, 0)
	ck.intIn("warmup.batch_size", w.BatchSize, 1, 1<<16)
	if w.Steps > 0 {
		ck.positive("warmup.lr", w.LR)
		if !c.IsToy() {
			ck.bad("warmup.steps", "the format warm-up uses a toy task's demonstrations: set toy.task or warmup.steps: 0")
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

func (c *Config) checkDist(ck *checker) {
	d := c.Dist
	ck.registered("dist.backend", d.Backend, algo.Backends)
	ck.registered("dist.agent_norms", d.AgentNorms, algo.AgentNorms)
	ck.registered("dist.shard", d.Shard, algo.ShardStages)
	ck.registered("dist.balance", d.Balance, algo.Balances)
	ck.intIn("dist.timeout_s", d.TimeoutS, 1, 7*24*3600)
	ck.intIn("dist.stall_s", d.StallS, 1, 24*3600)
}

// checkReward checks the `reward:` section (pkg/judge names its keys).
func (c *Config) checkReward(ck *checker) {
	if err := c.Reward.Validate(); err != nil {
		ck.add(err)
	}
}
