package tokenizer

import (
	"encoding/json"
	"strings"
	"unicode"
)

// Tokenizer is a byte-level BPE tokenizer. It is safe for concurrent use.
type Tokenizer struct {
	spec fileSpec // what Save writes

	model     *bpe
	normalize normalizeFunc
	pre       *preTokenizer

	added      map[string]addedToken // by content
	addedByID  map[int]addedToken
	addedFirst [256][]addedToken // by first byte, longest first
	idToToken  map[int]string    // model vocabulary, inverted
	idBytes    [][]byte          // the bytes each id decodes to, by id
	vocabSize  int
	cleanUp    bool // clean_up_tokenization_spaces from tokenizer_config.json
	growth     int  // normalizerGrowth of the normalizer (MaxTokens)
}

// VocabSize is the largest token id plus one, added tokens included: the
// number of rows an embedding matrix needs.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenID returns the id of a token: an added token by its content, a
// vocabulary token by its byte-level spelling (a leading space is "Ġ").
func (t *Tokenizer) TokenID(s string) (int, bool) {
	if at, ok := t.added[s]; ok {
		return at.ID, true
	}
	id, ok := t.model.vocab[s]
	return id, ok
}

// IDToken returns the token with this id (an added token's content, or a
// vocabulary token's byte-level spelling), or "" for an unknown id.
func (t *Tokenizer) IDToken(id int) string {
	if at, ok := t.addedByID[id]; ok {
		return at.Content
	}
	return t.idToToken[id]
}

// IsSpecial reports whether id is an added token marked special (such as
// "<|im_end|>"); Hugging Face drops these when decoding with
// skip_special_tokens.
func (t *Tokenizer) IsSpecial(id int) bool {
	return t.addedByID[id].Special
}

// Encode turns text into token ids. Added and special tokens written in the
// text map to their ids; Encode adds no BOS or EOS of its own.
func (t *Tokenizer) Encode(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	var words []string
	last := 0
	for i := 0; i < len(text); {
		at, start, end, ok := t.matchAdded(text, i, last)
		if !ok {
			i++
			continue
		}
		if start > last {
			ids, words = t.appendText(ids, words[:0], text[last:start])
		}
		ids = append(ids, at.ID)
		last, i = end, end
	}
	if last < len(text) {
		ids, _ = t.appendText(ids, words[:0], text[last:])
	}
	return ids
}

// matchAdded looks for the longest added token starting at byte i. It
// returns the token and the span it consumes, which with lstrip / rstrip
// includes the whitespace before (not past floor) or after it.
func (t *Tokenizer) matchAdded(text string, i, floor int) (addedToken, int, int, bool) {
	for _, at := range t.addedFirst[text[i]] {
		if !strings.HasPrefix(text[i:], at.Content) {
			continue
		}
		start, end := i, i+len(at.Content)
		if at.LStrip {
			start = floor + len(strings.TrimRightFunc(text[floor:start], unicode.IsSpace))
		}
		if at.RStrip {
			end = len(text) - len(strings.TrimLeftFunc(text[end:], unicode.IsSpace))
		}
		return at, start, end, true
	}
	return addedToken{}, 0, 0, false
}

// appendText encodes a stretch of text that holds no added token.
func (t *Tokenizer) appendText(ids []int, words []string, s string) ([]int, []string) {
	if t.normalize != nil {
		s = t.normalize(s)
	}
	words = t.pre.appendWords(words, s)
	for _, w := range words {
		ids = t.model.appendWord(ids, w)
	}
	return ids, words
}

// DecodeBytes returns the bytes that ids stand for. Ids that are not in the
// vocabulary are skipped, as Hugging Face does.
func (t *Tokenizer) DecodeBytes(ids []int) []byte {
	out := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		if id >= 0 && id < len(t.idBytes) {
			out = append(out, t.idBytes[id]...)
		}
	}
	return out
}

// Decode returns the text of ids: the exact inverse of Encode for text
// without added-token substrings (and, for models with a normalizer such as
// Qwen's NFC, for text already in that normal form). Special tokens are
// kept. Ids that end inside a multi-byte UTF-8 character, or otherwise form
// invalid UTF-8, decode as Hugging Face decodes them: each maximal invalid
// subsequence becomes one U+FFFD. When the model's tokenizer_config.json
// sets clean_up_tokenization_spaces (Llama 3.x), the spaces before
// punctuation and contractions are removed as transformers' decode removes
// them by default (" 's" → "'s"); DecodeBytes never cleans up.
func (t *Tokenizer) Decode(ids []int) string {
	s := lossyUTF8(t.DecodeBytes(ids))
	if t.cleanUp {
		s = cleanUpTokenization(s)
	}
	return s
}

// Text turns bytes of DecodeBytes (or a prefix of them) into text as Decode does: invalid UTF-8 as
// U+FFFD, clean-up of spaces when the model's tokenizer asks for it.
func (t *Tokenizer) Text(b []byte) string {
	s := lossyUTF8(b)
	if t.cleanUp {
		s = cleanUpTokenization(s)
	}
	return s
}

// CleansUpSpaces reports whether Decode applies transformers'
// clean_up_tokenization (tokenizer_config.json's
// clean_up_tokenization_spaces).
func (t *Tokenizer) CleansUpSpaces() bool { return t.cleanUp }

// MaxTokens is an upper bound on len(t.Encode(text)), text the concatenation of texts, found without
// encoding, or -1 when the
// tokenizer cannot bound it (a normalizer it does not know the growth of). Every token of a
// byte-level BPE stands for at least one byte of the normalized text; normalization leaves ASCII as
// it is and grows other bytes at most by its factor (UAX #15: 3× for NFC and NFD, 11× for NFKC and
// NFKD in UTF-8; lowercasing at most 3×); add_prefix_space adds at most one byte per stretch between
// added tokens, each of which is a byte or more. Cheap: one pass over the bytes.
func (t *Tokenizer) MaxTokens(texts ...string) int {
	g := t.growth
	if g < 0 {
		return -1
	}
	n := 0
	for _, text := range texts {
		n += len(text)
		if g > 1 {
			high := 0
			for i := 0; i < len(text); i++ {
				if text[i] >= 0x80 {
					high++
				}
			}
			n += (g - 1) * high
		}
	}
	if t.pre != nil && t.pre.addPrefixSpace {
		n = 2*n + 1
	}
	return n
}

// normalizerGrowth is the most a normalizer multiplies the UTF-8 length of non-ASCII text by: 1
// without one, -1 for one it cannot bound.
func normalizerGrowth(raw json.RawMessage) int {
	if isNull(raw) {
		return 1
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return -1
	}
	switch c.Type {
	case "NFC", "NFD", "Lowercase":
		return 3
	case "NFKC", "NFKD":
		return 11
	case "Sequence":
		g := 1
		for _, sub := range c.Normalizers {
			s := normalizerGrowth(sub)
			if s < 0 {
				return -1
			}
			g *= s
		}
		return g
	}
	return -1
}
