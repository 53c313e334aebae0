package policy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

// testdata/toy is a toy model folder (config.json, model.safetensors in bfloat16, tokenizer.json:
// the character-level tokenizer with the orchestras' tags) that the commands' examples run on.
// DRMAS_UPDATE_FIXTURES=1 rewrites it.
const toyDir = "testdata/toy"

func TestToyFixture(t *testing.T) {
	if os.Getenv("DRMAS_UPDATE_FIXTURES") != "" {
		tok := tokenizer.NewCharLevel(env.Tags(), nil)
		chat, err := tokenizer.BuiltinChatTemplate(tokenizer.TemplateChatML, "")
		if err != nil {
			t.Fatal(err)
		}
		cfg := arch.Config{ModelType: arch.Qwen2, HiddenSize: 16, IntermediateSize: 32, NumHiddenLayers: 2,
			NumAttentionHeads: 2, NumKeyValueHeads: 1, VocabSize: tok.VocabSize(), TieWordEmbeddings: true,
			InitializerRange: 0.5, MaxPositionEmbeddings: 1024}
		onTorch(t, func() error {
			m, err := NewRandom(cfg, gotch.CPU, gotch.BFloat16, 1)
			if err != nil {
				return err
			}
			p, err := NewPolicy("toy", m, tok, chat)
			if err != nil {
				return err
			}
			return p.Save(toyDir)
		})
	}
	var p *Policy
	onTorch(t, func() error {
		var err error
		p, err = LoadPolicy("toy", toyDir, gotch.CPU, gotch.Float)
		return err
	})
	if p.Chat.Name() != tokenizer.TemplateChatML || len(p.StopIDs) == 0 {
		t.Fatalf("toy folder: template %q, stop ids %v; want ChatML with <|im_end|>", p.Chat.Name(), p.StopIDs)
	}
	msgs := []llm.Message{{Role: "user", Content: "2+3?"}}
	a, err := p.Generate(context.Background(), []llm.Request{{Messages: msgs, Sampling: greedy(8)}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Generate(context.Background(), []llm.Request{{Messages: msgs, Sampling: greedy(8)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(a[0].ResponseIDs) == 0 || !slices.Equal(a[0].ResponseIDs, b[0].ResponseIDs) {
		t.Fatalf("greedy generation is not repeatable: %v, %v", a[0].ResponseIDs, b[0].ResponseIDs)
	}
	size := int64(0)
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		info, err := os.Stat(filepath.Join(toyDir, f))
		if err != nil {
			t.Fatal(err)
		}
		size += info.Size()
	}
	if size > 64<<10 {
		t.Fatalf("toy fixture is %d KB; keep it small", size>>10)
	}
}

// A stop string is found in the decoded text a token completes, even inside one multi-character
// token (stop "swe" and the token "<answer>"; before, only a suffix of the text matched).
func TestStopStringInsideAToken(t *testing.T) {
	var p *Policy
	onTorch(t, func() error {
		var err error
		p, err = LoadPolicy("toy", toyDir, gotch.CPU, gotch.Float)
		return err
	})
	answer, ok := p.Tok.TokenID("<answer>")
	if !ok {
		t.Fatal("the toy tokenizer has no <answer>")
	}
	x := p.Tok.Encode("x")[0]
	for _, tc := range []struct {
		stop  string
		ids   []int
		stops bool
	}{
		{"swe", []int{x, answer}, true}, // inside the token
		{"x<a", []int{x, answer}, true}, // across two tokens
		{"r>", []int{x, answer}, true},  // at its end
		{"q", []int{x, answer}, false},
	} {
		r := &row{sampling: llm.Sampling{Stop: []string{tc.stop}, MaxNewTokens: 10}}
		for _, id := range tc.ids {
			p.record(r, id, 0, nil)
		}
		if r.done != tc.stops {
			t.Errorf("stop %q after %q: done %v, want %v", tc.stop, p.Tok.Decode(tc.ids), r.done, tc.stops)
		}
	}
}

// GenerateStream hands out every token as it is sampled, with its top alternatives (the sampled
// token first for a greedy row, log-probs descending), and the tokens equal GenerateIDs'. A row
// whose context ends stops at its next step while the others go on.
func TestGenerateStreamTokensAndTop(t *testing.T) {
	var p *Policy
	onTorch(t, func() error {
		var err error
		p, err = LoadPolicy("toy", toyDir, gotch.CPU, gotch.Float)
		return err
	})
	prompts := [][]int{{60, 97, 110}, {61, 62}, {70, 71, 72, 73}}
	settings := []llm.Sampling{{MaxNewTokens: 12, Seed: 1}, {MaxNewTokens: 12, Temperature: 1, Seed: 2}, {MaxNewTokens: 200, Temperature: 1, Seed: 3}}
	want, err := p.GenerateIDs(context.Background(), prompts, settings)
	if err != nil {
		t.Fatal(err)
	}
	got := make([][]Token, 3)
	gone, leave := context.WithCancel(context.Background())
	defer leave()
	opts := make([]RowOptions, 3)
	for i := range opts {
		opts[i] = RowOptions{TopLogProbs: 3, OnToken: func(tk Token) {
			got[i] = append(got[i], tk)
			if i == 2 && len(got[2]) == 5 {
				leave()
			}
		}}
	}
	opts[2].Ctx = gone
	out, err := p.GenerateStream(context.Background(), prompts, settings, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if len(got[i]) != len(want[i].ResponseIDs) {
			t.Fatalf("row %d: %d streamed tokens, %d generated", i, len(got[i]), len(want[i].ResponseIDs))
		}
		for j, tk := range got[i] {
			if tk.ID != want[i].ResponseIDs[j] || tk.ID != out[i].ResponseIDs[j] {
				t.Errorf("row %d token %d: streamed %d, generated %d", i, j, tk.ID, want[i].ResponseIDs[j])
			}
			if len(tk.Top) != 3 || tk.Top[0].LogProb < tk.Top[1].LogProb || tk.Top[1].LogProb < tk.Top[2].LogProb {
				t.Fatalf("row %d token %d: top %v, want 3 descending", i, j, tk.Top)
			}
			if tk.LogProb > tk.Top[0].LogProb+1e-5 {
				t.Errorf("row %d token %d: sampled log-prob %g above the best alternative's %g", i, j, tk.LogProb, tk.Top[0].LogProb)
			}
			if i == 0 && (tk.Top[0].ID != tk.ID || tk.Top[0].LogProb != tk.LogProb) {
				t.Errorf("greedy token %d: %d (%g), best alternative %v", j, tk.ID, tk.LogProb, tk.Top[0])
			}
		}
	}
	if out[2].Finish != llm.FinishAbort || len(got[2]) > 6 {
		t.Errorf("row whose context ended: finish %q after %d tokens, want abort after ≤ 6", out[2].Finish, len(got[2]))
	}
}
