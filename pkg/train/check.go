package train

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
	"github.com/drmas/drmas/pkg/env/toy"
	"github.com/drmas/drmas/pkg/files"
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
		if w := reachable(r.URL, r.Timeout); w != "" {
			warnings = append(warnings, w)
		}
		retr = env.FactRetriever{}
	case retriever.TypeFacts:
		retr = env.FactRetriever{}
	}
	orch, err := env.NewOrchestra(cfg.Orchestra, cfg.EnvAgents(), retr)
	if err != nil {
		errs = append(errs, err)
	} else if err := env.CheckPrompts(orch); err != nil {
		errs = append(errs, err)
	}
	return warnings, errors.Join(errs...)
}

// checkModel loads what a model needs apart from its weights.
func checkModel(cfg *config.Config, mc config.ModelConfig) error {
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
func reachable(raw string, timeout time.Duration) string {
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
		return fmt.Sprintf("retriever.url %s is not reachable now (%v): start the retrieval server before training", raw, err)
	}
	c.Close()
	return ""
}
