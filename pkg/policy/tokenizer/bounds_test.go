package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Token ids beyond MaxVocabSize are refused when the tokenizer loads, naming the file (before: an
// added token at id 10⁹ passed `drmas train --dry-run` and training asked for 256 GB): in
// tokenizer.json's added_tokens and vocabulary, and in tokenizer_config.json's added_tokens_decoder.
func TestHugeTokenIDsRefused(t *testing.T) {
	data, err := os.ReadFile("../../../configs/toy/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	edit := func(fn func(doc map[string]any)) []byte {
		var doc map[string]any
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		fn(doc)
		out, _ := json.Marshal(doc)
		return out
	}
	huge := map[string]any{"id": 1_000_000_000, "content": "<huge>", "special": true}
	for name, c := range map[string]struct {
		tokenizer, config []byte
		want              []string
	}{
		"added token": {edit(func(d map[string]any) { d["added_tokens"] = append(d["added_tokens"].([]any), huge) }), nil,
			[]string{"tokenizer.json", `"<huge>": id 1000000000 exceeds the bound 4194303`}},
		"vocabulary": {edit(func(d map[string]any) { d["model"].(map[string]any)["vocab"].(map[string]any)["huge"] = 1_000_000_000 }), nil,
			[]string{"tokenizer.json", `"huge"]: id 1000000000 exceeds the bound`}},
		"tokenizer_config.json": {data, []byte(`{"added_tokens_decoder": {"1000000000": {"content": "<huge>", "special": true}}}`),
			[]string{"tokenizer_config.json", "id 1000000000 exceeds the bound"}},
	} {
		dir := t.TempDir()
		p := filepath.Join(dir, "tokenizer.json")
		if err := os.WriteFile(p, c.tokenizer, 0o644); err != nil {
			t.Fatal(err)
		}
		if c.config != nil {
			if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), c.config, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		tok, err := Load(p)
		if err == nil {
			t.Errorf("%s: loaded, vocabulary size %d", name, tok.VocabSize())
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err %q does not mention %q", name, err, w)
			}
		}
	}
}

// MaxTokens bounds the length of Encode without encoding, for the toy tokenizer and, when installed,
// the real ones (Qwen's NFC normalizer included), on ASCII, accented, CJK and NFKC-expanding text.
func TestMaxTokensBoundsEncode(t *testing.T) {
	paths := []string{"../../../configs/toy/tokenizer.json"}
	dir := os.Getenv("DRMAS_HF_TOKENIZERS")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", ".cache", "hf-tokenizers")
	}
	real, _ := filepath.Glob(filepath.Join(dir, "*", "tokenizer.json"))
	paths = append(paths, real...)
	texts := []string{"", "What is 2 + 3?", "<|im_start|>user\nhello<|im_end|>\n", "naïve café ﬁ ﷺ Å", "北京是中国的首都。",
		strings.Repeat("a", 1000), "e\u0301 \u0958 \u2126"}
	for _, p := range paths {
		tok, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range texts {
			n, bound := len(tok.Encode(s)), tok.MaxTokens(s)
			if bound < 0 || n > bound {
				t.Errorf("%s: %q: %d tokens, bound %d", p, s, n, bound)
			}
		}
	}
	if len(real) == 0 {
		t.Log("real tokenizers not installed (scripts/hf-tokenizers.sh): toy only")
	}
}
