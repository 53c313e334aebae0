// Package check is `drmas train --dry-run`'s checker: every check of a config that needs no weights
// (models' config.json, safetensors headers, tokenizers and chat templates, prompt templates, the
// first records of every data file, the retriever, the tools, the reward), and the prompt
// measurement the memory plan and the data load use (prompts.go). It opens the team's orchestra as
// training does (pkg/team), with a stand-in retriever.
package check

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/drmas/drmas/pkg/netaddr"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/team"
)

// checkLines is how many records of each data file a dry run parses.
const checkLines = 8

// Check does every check of a config that needs no weights, as `drmas train --dry-run` runs it: each
// model's config.json and safetensors headers, its tokenizer and chat template (rendered once), the
// agents' prompt templates (rendered with sample data), max_new_tokens against the model's
// positions, the first lines of every data file with the length of their first prompts (see
// Prompts) and the retriever's corpus or address. An
// unreachable retriever server is a warning (it may start later); everything else is an error.
func Check(cfg *config.Config) (warnings []string, err error) {
	var errs []error
	for _, mc := range cfg.Models {
		if err := checkModel(cfg.WeightsOf(mc), cfg.Agents); err != nil {
			errs = append(errs, fmt.Errorf("model %s: %w", mc.ID, err))
		}
	}
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
	box, err := team.OpenTools(cfg.Config, retr) // MCP servers started or reached, their tools listed
	if err != nil {
		return warnings, errors.Join(append(errs, err)...) // what follows needs the tools: it would only say they are missing
	} else if box != nil {
		defer box.Close()
	}
	// The orchestra as training builds it (the judge's prompt, its key's variable), its prompts
	// rendered once; the data's records measured with the same tools.
	if orch, err := team.NewOrchestra(cfg.Config, cfg.EnvAgents(cfg.ModelType), retr, box); err != nil {
		errs = append(errs, err)
	} else if err := env.CheckPrompts(orch); err != nil {
		errs = append(errs, err)
	}
	if !cfg.IsToy() {
		pc, err := NewPrompts(cfg, box)
		if err != nil { // the model or agent checks name what is wrong
			pc = nil
		}
		errs = append(errs, checkData(cfg.Config, pc)...)
	} else if _, err := toy.Tasks(cfg.Toy, toy.Val); err != nil { // a toy task builds its split
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

// checkModel loads what a model needs apart from its weights, and bounds its agents'
// max_new_tokens by its context.
func checkModel(mc model.Config, agents []team.Agent) error {
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
	for i, a := range agents {
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

// checkData parses the first records of every data file, their prompts measured by pc (nil: not
// measured).
func checkData(c team.Config, pc *Prompts) []error {
	var keep func(env.Task) (bool, error)
	if pc != nil {
		keep = pc.Keep
	}
	opts := c.DataOptions(checkLines, keep)
	var errs []error
	if _, err := dataset.Load(c.Data.Train, opts); err != nil {
		errs = append(errs, fmt.Errorf("data.train: %w", err))
	}
	for i, p := range c.Data.Val {
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
	if err := netaddr.Dial(u, min(timeout, 3*time.Second)); err != nil {
		return fmt.Sprintf("%s %s is not reachable now (%v): start the %s before training", key, raw, err, server)
	}
	return ""
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
