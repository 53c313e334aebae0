package tokenizer

import (
	"encoding/json"
	"fmt"
)

// Special tokens of the toy tokenizer. Toy models use the ChatML template
// with ImEnd as the end of a turn and EndOfText as padding.
const (
	EndOfText = "<|endoftext|>"
	ImStart   = "<|im_start|>"
	ImEnd     = "<|im_end|>"
)

// NewCharLevel builds the tokenizer of a toy model: a byte-level BPE with no
// merges, so every byte is one token (ids 0-255 are the bytes 0-255, and
// for ASCII text one token is one character), followed by the special tokens
// EndOfText, ImStart, ImEnd, then extraSpecial (special), then tags (added,
// not special: the orchestras' "<search>", "</search>", "<answer>" … are
// ordinary output the model learns to write, each as a single token).
// Duplicates and empty strings are skipped. Save writes it as a
// tokenizer.json that Hugging Face tokenizers also loads.
func NewCharLevel(tags []string, extraSpecial []string) *Tokenizer {
	vocab := make(vocabSpec, 256)
	for b := 0; b < 256; b++ {
		vocab[byteToString[b]] = b
	}
	spec := fileSpec{
		Version:       "1.0",
		Normalizer:    json.RawMessage("null"),
		PreTokenizer:  json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}`),
		PostProcessor: json.RawMessage("null"),
		Decoder:       json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}`),
		Model:         modelSpec{Type: "BPE", Vocab: vocab, Merges: mergeList{pairs: [][2]string{}}},
	}
	seen := map[string]bool{}
	add := func(content string, special bool) {
		if content == "" || seen[content] {
			return
		}
		seen[content] = true
		spec.AddedTokens = append(spec.AddedTokens, addedToken{
			ID: 256 + len(spec.AddedTokens), Content: content, Special: special,
		})
	}
	for _, s := range []string{EndOfText, ImStart, ImEnd} {
		add(s, true)
	}
	for _, s := range extraSpecial {
		add(s, true)
	}
	for _, s := range tags {
		add(s, false)
	}
	t, err := build(spec)
	if err != nil {
		panic(fmt.Sprintf("tokenizer: NewCharLevel built an invalid spec: %v", err))
	}
	return t
}
