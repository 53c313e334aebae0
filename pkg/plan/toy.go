package plan

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/toy"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/team"
)

// toyPrompts measures the longest prompt, in tokens, that each agent (by index in cfg.Agents) of a
// toy task receives: it plays the orchestra over one training batch with toy.FormatPolicy (every
// response well formed, so episodes run their full course), at iteration 0 (the curriculum's
// contexts) and without the curriculum (validation's), and encodes every request as the policy
// would (chat template, then tokenizer). Toy questions are short and regular, so the longest of a
// batch is the longest there is. Not a toy task, or a model without a tokenizer file: nil, with a note.
func toyPrompts(cfg *config.Config) (map[int]int, string, error) {
	if !cfg.IsToy() || cfg.Data.MaxPromptLength > 0 {
		return nil, "", nil
	}
	if cfg.Orchestra.Runner != nil {
		return nil, "toy prompts not measured (the gateway's prompts are its runner's): bounded by the context", nil
	}
	encoders := map[string]func([]llm.Message, map[string]any) (int, error){}
	for _, mc := range cfg.Models {
		mc = cfg.WeightsOf(mc)
		tokPath, chatDir := mc.Tokenizer, filepath.Dir(mc.Tokenizer)
		if mc.Path != "" {
			chatDir = mc.Path
			if tokPath == "" {
				tokPath = filepath.Join(mc.Path, "tokenizer.json")
			}
		}
		tok, err := tokenizer.Load(tokPath)
		if err != nil {
			return nil, fmt.Sprintf("toy prompts not measured (model %s: %v): bounded by the context", mc.ID, err), nil
		}
		chat, err := tokenizer.LoadChatTemplate(chatDir)
		if err != nil {
			return nil, fmt.Sprintf("toy prompts not measured (model %s: chat template: %v): bounded by the context", mc.ID, err), nil
		}
		encoders[mc.ID] = func(msgs []llm.Message, kwargs map[string]any) (int, error) {
			text, err := chat.RenderWith(msgs, true, kwargs) // tokenizer.Message is llm.Message
			if err != nil {
				return 0, err
			}
			return len(tok.Encode(text)), nil
		}
	}
	// The orchestra as training builds it, its tools open: their definitions are in the prompts.
	box, err := team.OpenTools(cfg.Config, env.FactRetriever{})
	if err != nil {
		return nil, "", err
	}
	if box != nil {
		defer box.Close()
	}
	orch, err := team.NewOrchestra(cfg.Config, cfg.EnvAgents(cfg.ModelType), env.FactRetriever{}, box)
	if err != nil {
		return nil, "", err
	}
	tasks, err := toy.Tasks(cfg.Toy, toy.Train)
	if err != nil {
		return nil, "", fmt.Errorf("toy: %w", err)
	}
	tasks = tasks[:min(len(tasks), max(cfg.Algorithm.BatchSize, 1))]
	gen := &measure{inner: toy.FormatPolicy{Config: cfg.Toy}, encode: encoders, longest: map[string]int{}}
	for _, eval := range []bool{false, true} {
		if _, err := orch.Run(context.Background(), gen, tasks, max(cfg.Algorithm.GroupSize, 1), env.RunOptions{Seed: cfg.Run.Seed, Eval: eval}); err != nil {
			return nil, "", fmt.Errorf("toy prompts: %w", err)
		}
	}
	out := map[int]int{}
	for j, a := range cfg.Agents {
		if n, ok := gen.longest[a.Name]; ok {
			out[j] = n
		}
	}
	return out, "", nil
}

// measure is a generator that records the longest encoded prompt per agent and answers with inner.
type measure struct {
	inner   llm.Generator
	encode  map[string]func([]llm.Message, map[string]any) (int, error)
	mu      sync.Mutex
	longest map[string]int
}

func (g *measure) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	for _, r := range reqs {
		enc, ok := g.encode[r.Model]
		if !ok {
			return nil, fmt.Errorf("agent %s: model %q has no tokenizer", r.Agent, r.Model)
		}
		n, err := enc(r.Messages, r.ChatTemplateKwargs)
		if err != nil {
			return nil, fmt.Errorf("agent %s: chat template: %w", r.Agent, err)
		}
		g.mu.Lock()
		g.longest[r.Agent] = max(g.longest[r.Agent], n)
		g.mu.Unlock()
	}
	return g.inner.Generate(ctx, reqs)
}
