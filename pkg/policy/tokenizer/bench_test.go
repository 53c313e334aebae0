package tokenizer

import (
	"path/filepath"
	"strings"
	"testing"
)

// benchPrompt is a rollout-sized prompt: role text, tags, numbers, newlines.
var benchPrompt = strings.Repeat("<|im_start|>user\nYou are the Searcher. Question: which key maps to 17? "+
	"Emit <search>query</search>; the top-3 results come back as <information>…</information>.<|im_end|>\n", 8)

func BenchmarkEncodeQwenStyle(b *testing.B) {
	tok, err := parse(testTokenizerJSON(qwenPreTokenizer, `{"type":"NFC"}`, false, false, false))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(benchPrompt)))
	for b.Loop() {
		tok.Encode(benchPrompt)
	}
}

func BenchmarkEncodeCharLevel(b *testing.B) {
	tok := NewCharLevel([]string{"<search>", "</search>", "<information>", "</information>"}, nil)
	b.SetBytes(int64(len(benchPrompt)))
	for b.Loop() {
		tok.Encode(benchPrompt)
	}
}

func BenchmarkDecode(b *testing.B) {
	tok, err := parse(testTokenizerJSON(qwenPreTokenizer, "null", false, false, false))
	if err != nil {
		b.Fatal(err)
	}
	ids := tok.Encode(benchPrompt)
	b.SetBytes(int64(len(benchPrompt)))
	for b.Loop() {
		tok.Decode(ids)
	}
}

func BenchmarkRenderQwen3Jinja(b *testing.B) {
	ct, err := LoadChatTemplate(filepath.Join("testdata", "models", "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "You are the Verifier."}, {Role: "user", Content: "Question: 2+2? Answer: 4"}}
	for b.Loop() {
		if _, err := ct.Render(msgs, true); err != nil {
			b.Fatal(err)
		}
	}
}
