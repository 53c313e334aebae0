package policy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

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
		cfg := Config{ModelType: Qwen2, HiddenSize: 16, IntermediateSize: 32, NumHiddenLayers: 2,
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
