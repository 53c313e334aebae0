package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/model"
)

// Validate checks every section — each by the component that owns it — and that the sections fit
// each other (agents on models that exist, adapters on full models, the warm-up on a toy task), and
// reports each problem with its key, on one line.
func (c *Config) Validate() error {
	var ck choice.Problems
	c.checkRun(&ck)
	ids := c.checkModels(&ck)
	c.checkAgents(&ck, ids)
	ck.Add(c.Config.Validate(c.EnvAgents(c.ModelType)))
	ck.Add(c.Algorithm.Validate("algorithm", c.AgentNames()))
	ck.Add(c.Rollout.Validate("rollout"))
	c.checkWarmup(&ck)
	ck.Add(c.Dist.Validate("dist"))
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
		if b, ok := c.ModelByID(m.Base); ok && len(m.LoRA.Outer()) > 0 && b.Rollout.OuterLoRAVaries() {
			out = append(out, fmt.Sprintf("models[%d].lora.target_modules names %s and its base's rollouts run on %s: "+
				"engines' support of LoRA on embed_tokens and lm_head varies by version (vLLM has refused it for Qwen2/Qwen3); "+
				"drmas serve supports it; check yours, or target the projections only (docs/lora.md)", i, strings.Join(m.LoRA.Outer(), " and "), b.Rollout.Engine))
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
		if m.IsAdapter() {
			c.checkAdapter(ck, key, m)
			continue
		}
		ck.Add(m.Validate(key))
	}
	return ids
}

// checkAdapter checks an adapter entry (base: set): its own settings (model.ValidateAdapter), and
// that its base is a full model entry of the config.
func (c *Config) checkAdapter(ck *choice.Problems, key string, m model.Config) {
	switch b, ok := c.ModelByID(m.Base); {
	case m.Base == m.ID:
		ck.Bad(key+".base", "%q is the entry itself (want another model entry's id)", m.Base)
	case !ok:
		ck.Bad(key+".base", "unknown model %q (models: %s)", m.Base, strings.Join(c.modelIDs(), ", "))
	case b.IsAdapter():
		ck.Bad(key+".base", "model %q is itself an adapter (on %q): an adapter's base must be a full model", m.Base, b.Base)
	}
	ck.Add(m.ValidateAdapter(key))
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

// checkAgents checks the agents list against the models and each agent's training overrides
// (pkg/team and env own the agents' own settings, llm.Sampling.Check the sampling rules).
func (c *Config) checkAgents(ck *choice.Problems, ids map[string]int) {
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
