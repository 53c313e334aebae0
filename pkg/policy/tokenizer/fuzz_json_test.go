package tokenizer

import (
	"os"
	"testing"
)

// FuzzTokenizerJSON feeds arbitrary tokenizer.json bytes to the parser: it never panics, and a
// tokenizer it accepts encodes and decodes text into ids inside its vocabulary.
func FuzzTokenizerJSON(f *testing.F) {
	if b, err := os.ReadFile("../../../configs/toy/tokenizer.json"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{``, `{}`, `null`, `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}`,
		`{"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}}`, `{"model": {"type": "WordPiece"}}`,
		`{"added_tokens": [{"id": 99999999999, "content": "<x>", "special": true}], "model": {"type": "BPE", "vocab": {}, "merges": []}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := parse(data)
		if err != nil {
			return
		}
		ids := tok.Encode("hello <x> ab")
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("id %d outside the vocabulary of %d", id, tok.VocabSize())
			}
		}
		_ = tok.Decode(ids)
	})
}
