package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
	"github.com/drmas/drmas/pkg/env/toy"
	"github.com/drmas/drmas/pkg/files"
	"github.com/drmas/drmas/pkg/judge"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/plan"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

// checkLines is how many records of each data file a dry run parses.
const checkLines = 8

// Check does every check of a config that needs no weights, as `drmas train --dry-run` runs it: each
// model's config.json and safetensors headers, its tokenizer and chat template (rendered once), the
// agents' prompt templates (rendered with sample data), max_new_tokens against the model's
// positions, the first lines of every data file with the length of their first prompts (see
// promptCheck) and the retriever's corpus or address. An
// unreachable retriever server is a warning (it may start later); everything else is an error.
func Check(cfg *config.Config) (warnings []string, err error) {
	var errs []error
	for _, mc := range cfg.Models {
		if err := checkModel(cfg, cfg.WeightsOf(mc)); err != nil {
			errs = append(errs, fmt.Errorf("model %s: %w", mc.ID, err))
		}
	}
	errs = append(errs, checkData(cfg)...)
	retr := env.Retriever(nil)
	switch r := cfg.Retriever; r.Type {
	case retriever.TypeEmbedded:
		if f, err := files.Open(r.Corpus, 0); err != nil {
			errs = append(errs, fmt.Errorf("retriever.corpus: %w", err))
		} else {
			f.Close()
		}
		retr = env.FactRetriever{}
	case retriever.TypeHTTP:
		if w := reachable("retriever.url", r.URL, r.Timeout, "retrieval server"); w != "" {
			warnings = append(warnings, w)
		}
		retr = env.FactRetriever{}
	case retriever.TypeFacts:
		retr = env.FactRetriever{}
	}
	var opts []env.Option
	box, err := openTools(cfg, retr) // MCP servers started or reached, their tools listed
	if err != nil {
		errs = append(errs, err)
	} else if box != nil {
		defer box.Close()
		opts = append(opts, env.WithTools(box.Toolbox()))
	}
	orch, err := env.NewOrchestra(cfg.Orchestra, cfg.EnvAgents(cfg.ModelType), retr, opts...)
	if err != nil {
		errs = append(errs, err)
	} else if err := env.CheckPrompts(orch); err != nil {
		errs = append(errs, err)
	} else if _, err := judge.Wrap(orch, cfg.Reward); err != nil { // the judge's prompt, its key's variable
		errs = append(errs, err)
	}
	if u, what := rewardURL(cfg.Reward); u != "" {
		if w := reachable(what, u, 3*time.Second, cfg.Reward.Type+" reward's server"); w != "" {
			warnings = append(warnings, w)
		}
	}
	return warnings, errors.Join(errs...)
}

// rewardURL is the address of a judge or remote reward and its key ("" under the rule reward).
func rewardURL(r judge.Config) (url, key string) {
	switch r.Type {
	case judge.TypeJudge:
		return r.Judge.URL, "reward.judge.url"
	case judge.TypeRemote:
		return r.Remote.URL, "reward.remote.url"
	}
	return "", ""
}

// checkModel loads what a model needs apart from its weights.
func checkModel(cfg *config.Config, mc model.Config) error {
	tok, chat, maxPos, err := modelText(mc)
	if err != nil {
		return err
	}
	if mc.Path != "" {
		if err := checkWeights(mc.Path); err != nil {
			return err
		}
	}
	text, err := chat.Render([]tokenizer.Message{{Role: "system", Content: "You are a solver."}, {Role: "user", Content: "What is 2 + 3?"}}, true)
	if err != nil {
		return fmt.Errorf("chat template %s: %w", chat.Name(), err)
	}
	promptLen := len(tok.Encode(text))
	for i, a := range cfg.Agents {
		if a.Model != mc.ID {
			continue
		}
		if n := a.Sampling.Resolve().MaxNewTokens; maxPos > 0 && promptLen+n > maxPos {
			return fmt.Errorf("agents[%d].sampling.max_new_tokens %d + a %d-token prompt exceeds max_position_embeddings %d", i, n, promptLen, maxPos)
		}
	}
	return nil
}

// checkWeights reads the safetensors headers of a model folder (no tensor data).
func checkWeights(dir string) error {
	single := filepath.Join(dir, "model.safetensors")
	if _, err := os.Stat(single); err == nil {
		return policy.CheckSafetensors(single)
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(shards) == 0 {
		return fmt.Errorf("%s: no model.safetensors or shards", dir)
	}
	for _, s := range shards {
		if err := policy.CheckSafetensors(s); err != nil {
			return err
		}
	}
	return nil
}

// checkData parses the first records of every data file (a toy task builds its split).
func checkData(cfg *config.Config) []error {
	if cfg.IsToy() {
		if _, err := toy.Tasks(cfg.Toy, toy.Val); err != nil {
			return []error{err}
		}
		return nil
	}
	opts := dataset.Options{Fields: dataset.Fields(cfg.Data.Fields), Shape: dataset.Shape(cfg.Data.Shape), Limit: checkLines}
	if pc, err := newPromptCheck(cfg); err == nil { // else the model or agent checks name what is wrong
		opts = pc.options(opts)
	}
	var errs []error
	if _, err := dataset.Load(cfg.Data.Train, opts); err != nil {
		errs = append(errs, fmt.Errorf("data.train: %w", err))
	}
	for i, p := range cfg.Data.Val {
		if _, err := dataset.Load(p, opts); err != nil {
			errs = append(errs, fmt.Errorf("data.val[%d]: %w", i, err))
		}
	}
	return errs
}

// reachable dials the retriever's host and returns a warning when nothing answers.
func reachable(key, raw string, timeout time.Duration, server string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	c, err := net.DialTimeout("tcp", host, min(timeout, 3*time.Second))
	if err != nil {
		return fmt.Sprintf("%s %s is not reachable now (%v): start the %s before training", key, raw, err, server)
	}
	c.Close()
	return ""
}

// promptCheck measures, as a dataset is read, the prompts that open an episode of each task
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
type promptCheck struct {
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

// modelText loads what a configured model's prompts are written and counted with: its tokenizer, its
// chat template and its max_position_embeddings (from the model folder's config.json, else init).
func modelText(mc model.Config) (*tokenizer.Tokenizer, *tokenizer.ChatTemplate, int, error) {
	tokPath, chatDir := mc.Tokenizer, filepath.Dir(mc.Tokenizer)
	maxPos := mc.Init.MaxPosition
	if mc.Path != "" {
		pc, err := arch.ReadConfig(filepath.Join(mc.Path, "config.json"))
		if err != nil {
			return nil, nil, 0, err
		}
		maxPos = pc.MaxPositionEmbeddings
		if tokPath == "" {
			tokPath = filepath.Join(mc.Path, "tokenizer.json")
		}
		chatDir = mc.Path
	}
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		return nil, nil, 0, err
	}
	chat, err := tokenizer.LoadChatTemplate(chatDir)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("chat template: %w", err)
	}
	if mc.Path != "" {
		if err := checkPairing(filepath.Join(mc.Path, "config.json"), tokPath, tok, chat); err != nil {
			return nil, nil, 0, err
		}
	}
	return tok, chat, maxPos, nil
}

// checkPairing refuses a tokenizer that is not the model's, naming both files: more tokens than the
// model's vocabulary, a special token id of config.json (bos_token_id, eos_token_id) beyond the
// tokenizer's tokens, or a chat template whose end-of-turn marker the tokenizer
// does not hold as one token (the model would never learn to stop).
func checkPairing(configPath, tokPath string, tok *tokenizer.Tokenizer, chat *tokenizer.ChatTemplate) error {
	pc, err := arch.ReadConfig(configPath)
	if err != nil {
		return err
	}
	mismatch := func(format string, args ...any) error {
		return fmt.Errorf("tokenizer %s does not belong to the model of %s: %s", tokPath, configPath, fmt.Sprintf(format, args...))
	}
	if pc.VocabSize > 0 && tok.VocabSize() > pc.VocabSize {
		return mismatch("%d tokens, more than the model's vocab_size %d", tok.VocabSize(), pc.VocabSize)
	}
	ids := slices.Clone(pc.EOSTokenIDs)
	if pc.BOSTokenID != nil {
		ids = append(ids, *pc.BOSTokenID)
	}
	for _, id := range ids {
		if id >= tok.VocabSize() {
			return mismatch("config.json's special token id %d is outside the tokenizer's %d tokens", id, tok.VocabSize())
		}
	}
	for _, marker := range chat.EndOfTurn() {
		if _, ok := tok.TokenID(marker); !ok {
			return mismatch("the chat template %s ends a turn with %q, which the tokenizer does not hold as one token", chat.Name(), marker)
		}
	}
	return nil
}

// newPromptCheck prepares the check of a config's datasets: its orchestra (with a stand-in retriever:
// no opening searches, and stand-in definitions of the MCP servers' tools, which are not started
// here: their names with empty parameters) and the tokenizer and chat template of every model.
func newPromptCheck(cfg *config.Config) (*promptCheck, error) {
	orch, err := env.NewOrchestra(cfg.Orchestra, cfg.EnvAgents(cfg.ModelType), env.FactRetriever{},
		env.WithTools(env.BuiltinTools{Retriever: env.FactRetriever{}, TopK: cfg.Orchestra.TopK, Extra: namedTools{}}))
	if err != nil {
		return nil, err
	}
	pc := &promptCheck{orch: orch, models: map[string]*promptModel{}, maxPrompt: cfg.Data.MaxPromptLength,
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

// options adds the check to dataset options.
func (pc *promptCheck) options(o dataset.Options) dataset.Options {
	o.Check = pc.keep
	o.SkipReason = "prompt longer than the limit (data.filter_overlong_prompts)"
	return o
}

// keep measures the openings of t: false (skip) or an error when one is over its limit.
func (pc *promptCheck) keep(t env.Task) (bool, error) {
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
func (pc *promptCheck) measure(t env.Task) error {
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
// a toy task (the plan measures its prompts itself).
func MeasurePrompts(cfg *config.Config) ([]plan.MeasuredPrompt, error) {
	if cfg.IsToy() {
		return nil, nil
	}
	pc, err := newPromptCheck(cfg)
	if err != nil {
		return nil, err
	}
	pc.longest = map[string]int{}
	opts := pc.options(dataset.Options{Fields: dataset.Fields(cfg.Data.Fields), Shape: dataset.Shape(cfg.Data.Shape), Limit: cfg.Data.Limit})
	if _, err := dataset.Load(cfg.Data.Train, opts); err != nil {
		return nil, fmt.Errorf("data.train: %w", err)
	}
	if _, err := readSets(cfg.Data.Val, opts, "data.val"); err != nil {
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
func (pc *promptCheck) limit(m *promptModel, a *env.Agent) (int, string) {
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

// namedTools stands in for tools that are not started: any name, with empty parameters; no call runs.
type namedTools struct{}

func (namedTools) Specs(names []string) ([]map[string]any, error) {
	out := make([]map[string]any, len(names))
	for i, n := range names {
		out[i] = map[string]any{"type": "function", "function": map[string]any{"name": n, "description": "",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{}}}}
	}
	return out, nil
}

func (namedTools) Call(context.Context, *env.Task, string, json.RawMessage) (string, error) {
	return "", errors.New("tools are not started in a prompt check")
}
