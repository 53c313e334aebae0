package check

import (
	"fmt"
	"strings"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/plan"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/team"
	"github.com/drmas/drmas/pkg/tool"
)

// Prompts measures, as a dataset is read, the prompts that open an episode of each task
// (env.Openings: the orchestra's first call, rendered with the agent's prompt template) in tokens as
// the agent's model encodes them (its chat template with the generation prompt, then its tokenizer),
// against data.max_prompt_length and the model's max_position_embeddings less the agent's
// max_new_tokens (the smaller; data.max_prompt_length 0: the latter alone). An over-long record is
// an error naming its file and line, or, with data.filter_overlong_prompts, skipped and counted, as
// verl's filter_overlong_prompts does. Before, such a record passed the load and `--dry-run` and
// the run died when the record was drawn.
//
// It stays cheap on large datasets: a chat template that writes a user message as fixed text around
// the content (checked once per agent with two probes) gives the rendered length without rendering,
// and the tokenizer's MaxTokens bounds the tokens without encoding; only the records whose bound
// exceeds the limit are rendered and encoded exactly.
type Prompts struct {
	orch      env.Orchestra
	models    map[string]*promptModel
	maxPrompt int
	filter    bool
	// longest, when not nil, records each agent's longest first-turn prompt (env.FirstPrompts) of
	// the records kept, in exact tokens (MeasurePrompts).
	longest map[string]int
}

// promptModel is what a model's agents' prompts are measured with.
type promptModel struct {
	id     string
	tok    *tokenizer.Tokenizer
	chat   *tokenizer.ChatTemplate
	maxPos int
	frames map[*env.Agent]chatFrame
}

// chatFrame is the text a chat template writes before and after a one-user-message conversation's
// content; ok is false when the template does more with the content than write it (then every
// prompt is rendered).
type chatFrame struct {
	prefix, suffix string
	ok             bool
}

// NewPrompts prepares the measurement of a config's prompts: its orchestra as the team's (pkg/team)
// over box, the team's tools (their definitions are in the prompts), with a stand-in retriever (no
// opening searches), and the tokenizer and chat template of every model.
func NewPrompts(cfg *config.Config, box *tool.Box) (*Prompts, error) {
	orch, err := team.NewOrchestra(cfg.Config, cfg.EnvAgents(cfg.ModelType), env.FactRetriever{}, box)
	if err != nil {
		return nil, err
	}
	pc := &Prompts{orch: orch, models: map[string]*promptModel{}, maxPrompt: cfg.Data.MaxPromptLength,
		filter: cfg.Data.FilterOverlongPrompts}
	for _, mc := range cfg.Models {
		tok, chat, maxPos, err := modelText(cfg.WeightsOf(mc))
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", mc.ID, err)
		}
		pc.models[mc.ID] = &promptModel{id: mc.ID, tok: tok, chat: chat, maxPos: maxPos, frames: map[*env.Agent]chatFrame{}}
	}
	return pc, nil
}

// Keep measures the openings of t, a data record: false (skip, under data.filter_overlong_prompts)
// or an error naming the agent and the bound when one is over its limit.
func (pc *Prompts) Keep(t env.Task) (bool, error) {
	ops, err := env.Openings(pc.orch, t)
	if err != nil {
		return false, err
	}
	for _, op := range ops {
		m := pc.models[op.Agent.Model]
		if m == nil {
			return false, fmt.Errorf("agent %s: no model %q", op.Agent.Name, op.Agent.Model)
		}
		limit, why := pc.limit(m, op.Agent)
		n, err := m.count(op.Agent, op.Prompt, limit)
		if err != nil {
			return false, fmt.Errorf("agent %s's first prompt: %w", op.Agent.Name, err)
		}
		if n <= limit {
			continue
		}
		if pc.filter {
			return false, nil
		}
		return false, fmt.Errorf("agent %s's first prompt is %d tokens (model %s), more than %s; set data.filter_overlong_prompts: true to skip such records",
			op.Agent.Name, n, m.id, why)
	}
	if pc.longest != nil {
		return true, pc.measure(t)
	}
	return true, nil
}

// measure records the longest first-turn prompt of each agent: exact tokens, counted only where the
// tokenizer's bound exceeds the longest so far.
func (pc *Prompts) measure(t env.Task) error {
	ps, err := env.FirstPrompts(pc.orch, t)
	if err != nil {
		return err
	}
	for _, op := range ps {
		m := pc.models[op.Agent.Model]
		if m == nil {
			return fmt.Errorf("agent %s: no model %q", op.Agent.Name, op.Agent.Model)
		}
		best := pc.longest[op.Agent.Name]
		if f := m.frame(op.Agent); f.ok {
			if n := m.tok.MaxTokens(f.prefix, op.Prompt, f.suffix); n >= 0 && n <= best {
				continue
			}
		}
		text, err := m.render(op.Agent, op.Prompt)
		if err != nil {
			return fmt.Errorf("agent %s's first prompt: %w", op.Agent.Name, err)
		}
		pc.longest[op.Agent.Name] = max(best, len(m.tok.Encode(text)))
	}
	return nil
}

// MeasurePrompts reads the config's data files (data.train and data.val, data.limit records each,
// the over-long ones skipped or refused as a run's load does) and measures each agent's prompts
// in tokens as its model encodes them: the longest first-turn prompt (every record's question in
// the agent's prompt with an empty team context, through the chat template with the generation
// prompt), and a bound on any turn's: that plus what the orchestra's later turns add
// (env.LaterTurns: each earlier response at most the team's largest max_new_tokens, with the text
// the context writes around it and two tokens of re-encoding slack, and the response under
// review). The memory plan takes the bound when data.max_prompt_length is unset (pkg/plan). Nil for
// a toy task (the plan measures its prompts itself) and under data.max_prompt_length (the bound).
func MeasurePrompts(cfg *config.Config) ([]plan.MeasuredPrompt, error) {
	if cfg.IsToy() || cfg.Data.MaxPromptLength > 0 {
		return nil, nil
	}
	box, err := team.OpenTools(cfg.Config, env.FactRetriever{}) // the tools' definitions are in the prompts
	if err != nil {
		return nil, err
	}
	if box != nil {
		defer box.Close()
	}
	pc, err := NewPrompts(cfg, box)
	if err != nil {
		return nil, err
	}
	pc.longest = map[string]int{}
	opts := cfg.DataOptions(cfg.Data.Limit, pc.Keep)
	if _, err := dataset.Load(cfg.Data.Train, opts); err != nil {
		return nil, fmt.Errorf("data.train: %w", err)
	}
	if _, err := team.ReadSets(cfg.Data.Val, opts, "data.val"); err != nil {
		return nil, err
	}
	calls, entry, why, bounded := env.LaterTurns(pc.orch)
	resp, name := 0, ""
	for _, a := range cfg.Agents {
		resp = max(resp, a.Sampling.Resolve().MaxNewTokens)
		if len(a.Name) > len(name) {
			name = a.Name
		}
	}
	var out []plan.MeasuredPrompt
	for j, a := range cfg.Agents {
		n, ok := pc.longest[a.Name]
		if !ok {
			continue
		}
		mp := plan.MeasuredPrompt{Agent: a.Name, Index: j, Model: a.Model, FirstTurn: n, Later: why,
			MaxNewTokens: a.Sampling.Resolve().MaxNewTokens}
		if bounded {
			frame := len(pc.models[a.Model].tok.Encode(fmt.Sprintf(entry, name, ""))) + 2
			mp.Bound = n + calls*(resp+frame) + resp + 2
		}
		out = append(out, mp)
	}
	return out, nil
}

// limit is the most tokens an agent's prompt may have, and why.
func (pc *Prompts) limit(m *promptModel, a *env.Agent) (int, string) {
	ctx := m.maxPos - a.Sampling.MaxNewTokens
	why := fmt.Sprintf("%d (max_position_embeddings %d less the agent's max_new_tokens %d)", ctx, m.maxPos, a.Sampling.MaxNewTokens)
	if m.maxPos <= 0 || (pc.maxPrompt > 0 && pc.maxPrompt <= ctx) {
		return pc.maxPrompt, fmt.Sprintf("data.max_prompt_length %d", pc.maxPrompt)
	}
	return ctx, why
}

// count returns the tokens of the agent's request with prompt as its user message, or a bound on them
// that is within limit.
func (m *promptModel) count(a *env.Agent, prompt string, limit int) (int, error) {
	if f := m.frame(a); f.ok {
		if n := m.tok.MaxTokens(f.prefix, prompt, f.suffix); n >= 0 && n <= limit {
			return n, nil
		}
	}
	text, err := m.render(a, prompt)
	if err != nil {
		return 0, err
	}
	return len(m.tok.Encode(text)), nil
}

// render is the prompt text of the agent's request, as policy.EncodePromptWith writes it.
func (m *promptModel) render(a *env.Agent, content string) (string, error) {
	return m.chat.RenderWith([]tokenizer.Message{{Role: "user", Content: content}}, true, a.ChatTemplateKwargs)
}

// frame finds (once per agent) the text the chat template writes around a user message: a probe
// renders as prefix + probe + suffix, and a second probe, with the whitespace templates trim and
// another length, renders within the same frame and no longer.
func (m *promptModel) frame(a *env.Agent) chatFrame {
	if f, ok := m.frames[a]; ok {
		return f
	}
	const probe, probe2 = "drmas-prompt-probe", " \n drmas second probe\twith more text \n "
	var f chatFrame
	if out, err := m.render(a, probe); err == nil && strings.Count(out, probe) == 1 {
		i := strings.Index(out, probe)
		f = chatFrame{prefix: out[:i], suffix: out[i+len(probe):]}
		out2, err := m.render(a, probe2)
		f.ok = err == nil && len(out2) >= len(f.prefix)+len(f.suffix) && strings.HasPrefix(out2, f.prefix) && strings.HasSuffix(out2, f.suffix) &&
			len(out2) <= len(f.prefix)+len(probe2)+len(f.suffix)
	}
	m.frames[a] = f
	return f
}
