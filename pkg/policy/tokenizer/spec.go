package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// fileSpec is the part of a Hugging Face tokenizer.json this package reads.
// The sections it does not interpret (truncation, padding, post_processor)
// are kept verbatim so that Save writes them back.
type fileSpec struct {
	Version       string          `json:"version"`
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         modelSpec       `json:"model"`
}

// addedToken is one entry of added_tokens.
type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// modelSpec is the "model" section of a BPE tokenizer.json.
type modelSpec struct {
	Type                    string    `json:"type"`
	Dropout                 *float64  `json:"dropout"`
	UnkToken                *string   `json:"unk_token"`
	ContinuingSubwordPrefix *string   `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string   `json:"end_of_word_suffix"`
	FuseUnk                 bool      `json:"fuse_unk"`
	ByteFallback            bool      `json:"byte_fallback"`
	IgnoreMerges            bool      `json:"ignore_merges"`
	Vocab                   vocabSpec `json:"vocab"`
	Merges                  mergeList `json:"merges"`
}

// vocabSpec is the token -> id map; it is written back in id order.
type vocabSpec map[string]int

// MarshalJSON writes the vocabulary sorted by id, as Hugging Face does.
func (v vocabSpec) MarshalJSON() ([]byte, error) {
	type entry struct {
		tok string
		id  int
	}
	entries := make([]entry, 0, len(v))
	for t, id := range v {
		entries = append(entries, entry{t, id})
	}
	sort.Slice(entries, func(a, b int) bool { return entries[a].id < entries[b].id })
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, e := range entries {
		if i > 0 {
			buf.WriteByte(',')
		}
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(e.tok); err != nil {
			return nil, err
		}
		buf.Truncate(buf.Len() - 1) // Encode's newline
		fmt.Fprintf(&buf, ":%d", e.id)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// mergeList holds the merges in rank order. tokenizer.json files written by
// tokenizers < 0.20 store each merge as "a b", newer ones as ["a", "b"];
// both are read and the form read is the form written back.
type mergeList struct {
	pairs  [][2]string
	legacy bool // "a b" strings
}

// UnmarshalJSON reads either merge format.
func (ml *mergeList) UnmarshalJSON(data []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("merges: %w", err)
	}
	ml.pairs = make([][2]string, len(raw))
	for i, r := range raw {
		var s string
		if err := json.Unmarshal(r, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return fmt.Errorf("merges[%d]: %q is not two tokens separated by one space", i, s)
			}
			ml.pairs[i] = [2]string{a, b}
			ml.legacy = true
			continue
		}
		var p []string
		if err := json.Unmarshal(r, &p); err != nil || len(p) != 2 {
			return fmt.Errorf("merges[%d]: want \"a b\" or [\"a\", \"b\"], got %s", i, r)
		}
		ml.pairs[i] = [2]string{p[0], p[1]}
	}
	return nil
}

// MarshalJSON writes the merges in the format they were read in.
func (ml mergeList) MarshalJSON() ([]byte, error) {
	if ml.legacy {
		s := make([]string, len(ml.pairs))
		for i, p := range ml.pairs {
			s[i] = p[0] + " " + p[1]
		}
		return json.Marshal(s)
	}
	if ml.pairs == nil {
		return []byte("[]"), nil
	}
	return json.Marshal(ml.pairs)
}

// component is a normalizer or pre-tokenizer entry: a type plus fields.
type component struct {
	Type string `json:"type"`

	// Sequence
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`

	// ByteLevel
	AddPrefixSpace bool  `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`

	// Split
	Pattern  *patternSpec `json:"pattern"`
	Behavior string       `json:"behavior"`
	Invert   bool         `json:"invert"`

	// Digits
	IndividualDigits bool `json:"individual_digits"`
}

// patternSpec is a Split pattern: a regex or a literal string.
type patternSpec struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

// isNull reports whether a raw JSON section is absent or null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}
