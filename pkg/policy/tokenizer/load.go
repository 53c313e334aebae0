package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/drmas/drmas/pkg/files"
)

// MaxVocabSize bounds token ids (and so the tables indexed by id, and a model's vocab_size): 4M,
// sixteen times the largest published vocabulary (Gemma 3's 262144). An id beyond it is refused
// when the tokenizer loads, naming the file, instead of tables of gigabytes.
const MaxVocabSize = 1 << 22

// Load reads a Hugging Face tokenizer.json, and the tokenizer_config.json
// beside it when there is one (clean_up_tokenization_spaces and
// added_tokens_decoder).
func Load(path string) (*Tokenizer, error) {
	data, err := files.Read(path, files.MaxJSON)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	if err := t.applyTokenizerConfig(filepath.Dir(path)); err != nil {
		return nil, err
	}
	return t, nil
}

// parse builds a Tokenizer from the contents of a tokenizer.json.
func parse(data []byte) (*Tokenizer, error) {
	var spec fileSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, err
	}
	return build(spec)
}

// build checks spec and makes the Tokenizer it describes.
func build(spec fileSpec) (*Tokenizer, error) {
	model, err := newBPE(spec.Model)
	if err != nil {
		return nil, err
	}
	if err := checkDecoder(spec.Decoder); err != nil {
		return nil, err
	}
	normalize, err := parseNormalizer(spec.Normalizer)
	if err != nil {
		return nil, err
	}
	pre, err := parsePreTokenizer(spec.PreTokenizer)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{
		spec:      spec,
		model:     model,
		normalize: normalize,
		pre:       pre,
		added:     make(map[string]addedToken, len(spec.AddedTokens)),
		addedByID: make(map[int]addedToken, len(spec.AddedTokens)),
		idToToken: make(map[int]string, len(model.vocab)),
		growth:    normalizerGrowth(spec.Normalizer),
	}
	for tok, id := range model.vocab {
		t.idToToken[id] = tok
		t.vocabSize = max(t.vocabSize, id+1)
	}
	if err := t.addTokens(spec.AddedTokens); err != nil {
		return nil, err
	}
	t.fillIDBytes()
	return t, nil
}

// fillIDBytes makes the table of the bytes each id decodes to.
func (t *Tokenizer) fillIDBytes() {
	t.idBytes = make([][]byte, t.vocabSize)
	for id := range t.idBytes {
		if at, ok := t.addedByID[id]; ok {
			t.idBytes[id] = []byte(at.Content)
		} else if tok := t.idToToken[id]; tok != "" {
			t.idBytes[id] = appendByteLevelDecoded(nil, tok)
		}
	}
}

// addTokens registers the added tokens and indexes them by first byte,
// longest first, for the leftmost-longest search in Encode.
func (t *Tokenizer) addTokens(tokens []addedToken) error {
	for i, at := range tokens {
		switch tok, inVocab := t.idToToken[at.ID]; {
		case at.Content == "":
			return fmt.Errorf("added_tokens[%d]: empty content", i)
		case at.ID < 0:
			return fmt.Errorf("added_tokens[%d] %q: negative id %d", i, at.Content, at.ID)
		case at.ID >= MaxVocabSize: // the tables indexed by id would be allocated for it
			return fmt.Errorf("added_tokens[%d] %q: id %d exceeds the bound %d", i, at.Content, at.ID, MaxVocabSize-1)
		case inVocab && tok != at.Content:
			return fmt.Errorf("added_tokens[%d] %q: id %d belongs to vocabulary token %q", i, at.Content, at.ID, tok)
		}
		if prev, dup := t.addedByID[at.ID]; dup && prev.Content != at.Content {
			return fmt.Errorf("added_tokens[%d] %q: id %d is also %q", i, at.Content, at.ID, prev.Content)
		}
		t.added[at.Content] = at
		t.addedByID[at.ID] = at
		t.vocabSize = max(t.vocabSize, at.ID+1)
	}
	for _, at := range t.added {
		b := at.Content[0]
		t.addedFirst[b] = append(t.addedFirst[b], at)
	}
	for b := range t.addedFirst {
		list := t.addedFirst[b]
		sort.Slice(list, func(i, j int) bool {
			if len(list[i].Content) != len(list[j].Content) {
				return len(list[i].Content) > len(list[j].Content)
			}
			return list[i].Content < list[j].Content
		})
	}
	return nil
}

// checkDecoder accepts a ByteLevel decoder, alone or as the only step of a
// Sequence; any other decoder would not invert this package's encoding.
func checkDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return fmt.Errorf("decoder: missing; want ByteLevel")
	}
	var d struct {
		Type     string            `json:"type"`
		Decoders []json.RawMessage `json:"decoders"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	if d.Type == "Sequence" && len(d.Decoders) == 1 {
		return checkDecoder(d.Decoders[0])
	}
	if d.Type != "ByteLevel" {
		return fmt.Errorf("decoder: type %q is not supported (want ByteLevel)", d.Type)
	}
	return nil
}

// Save writes the tokenizer as a Hugging Face tokenizer.json.
func (t *Tokenizer) Save(path string) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // write "<|im_end|>", not "\u003c|im_end|\u003e"
	enc.SetIndent("", "  ")
	if err := enc.Encode(t.spec); err != nil {
		return fmt.Errorf("save tokenizer %s: %w", path, err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("save tokenizer: %w", err)
	}
	return nil
}
