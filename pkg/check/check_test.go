package check

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
)

// tinyConfig is the toy math team's config (its tokenizer named from the repository root).
func tinyConfig(t *testing.T, sets ...string) *config.Config {
	t.Helper()
	cfg, err := config.Load("../../configs/toy-math.yaml", append([]string{"run.dir=" + t.TempDir()}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Models {
		cfg.Models[i].Tokenizer = "../../" + cfg.Models[i].Tokenizer
	}
	return cfg
}

// The cheap bound (chat frame + MaxTokens) never lets through a prompt that is over the limit when
// rendered and encoded exactly, and decides like the exact count at the limit, for the toy model and
// (when installed by scripts/hf-tokenizers.sh) Qwen's and Llama's real tokenizers and templates.
func TestPromptCountMatchesExactAtTheLimit(t *testing.T) {
	cfg := tinyConfig(t)
	pc, err := NewPrompts(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	agent := func() *env.Agent {
		ops, err := env.Openings(pc.orch, env.Task{ID: "x", Question: "q"})
		if err != nil || len(ops) != 1 {
			t.Fatalf("openings: %v, %v", ops, err)
		}
		return ops[0].Agent
	}()
	models := []*promptModel{pc.models[cfg.Models[0].ID]}
	hf, _ := filepath.Glob("../../.cache/hf-tokenizers/*/tokenizer.json")
	for _, p := range hf {
		mc := cfg.Models[0]
		mc.Tokenizer = p
		tok, chat, _, err := modelText(mc)
		if err != nil {
			t.Fatal(err)
		}
		models = append(models, &promptModel{id: p, tok: tok, chat: chat, frames: map[*env.Agent]chatFrame{}})
	}
	prompts := []string{"P1 + 1", "Pwhat is the capital of France? Think step by step.", " padded  ", "Pnaïve café 北京 ﬁ",
		"P" + strings.Repeat("long question ", 300)}
	for _, m := range models {
		if !m.frame(agent).ok {
			t.Errorf("%s: no chat frame (every prompt would be rendered)", m.id)
		}
		for _, p := range prompts {
			text, err := m.render(agent, p)
			if err != nil {
				t.Fatal(err)
			}
			exact := len(m.tok.Encode(text))
			for _, limit := range []int{exact - 1, exact, exact + 1, 2 * exact, 4*exact + 64} {
				n, err := m.count(agent, p, limit)
				if err != nil {
					t.Fatal(err)
				}
				if (n <= limit) != (exact <= limit) {
					t.Errorf("%s: %.20q: limit %d: counted %d, exactly %d", m.id, p, limit, n, exact)
				}
			}
		}
	}
}
