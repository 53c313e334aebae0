package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/drmas/drmas/pkg/files"
)

// What Load takes from tokenizer_config.json, the file transformers reads
// beside tokenizer.json: clean_up_tokenization_spaces (Decode tidies the
// spaces before punctuation and contractions, as transformers' decode does
// by default when the model asks for it: Llama 3.x) and added_tokens_decoder
// (added tokens that tokenizer.json may lack).

// applyTokenizerConfig reads tokenizer_config.json from dir, if there is
// one, into t.
func (t *Tokenizer) applyTokenizerConfig(dir string) error {
	path := filepath.Join(dir, "tokenizer_config.json")
	data, err := files.Read(path, files.MaxJSON)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load tokenizer: %w", err)
	}
	var cfg struct {
		CleanUp *bool                      `json:"clean_up_tokenization_spaces"`
		Added   map[string]json.RawMessage `json:"added_tokens_decoder"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("load tokenizer: %s: %w", path, err)
	}
	if cfg.CleanUp != nil {
		t.cleanUp = *cfg.CleanUp
	}
	tokens, err := parseAddedDecoder(cfg.Added)
	if err != nil {
		return fmt.Errorf("load tokenizer: %s: added_tokens_decoder%w", path, err)
	}
	var missing []addedToken
	for _, at := range tokens {
		prev, ok := t.addedByID[at.ID]
		switch {
		case ok && prev.Content != at.Content:
			return fmt.Errorf("load tokenizer: %s: added_tokens_decoder[%q]: %q, but tokenizer.json has id %d as %q",
				path, strconv.Itoa(at.ID), at.Content, at.ID, prev.Content)
		case !ok:
			missing = append(missing, at)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := t.addTokens(missing); err != nil {
		return fmt.Errorf("load tokenizer: %s: added_tokens_decoder: %w", path, err)
	}
	t.spec.AddedTokens = append(t.spec.AddedTokens, missing...)
	t.fillIDBytes()
	return nil
}

// parseAddedDecoder reads added_tokens_decoder: {"id": {"content": ...,
// "lstrip": ..., "special": ...}}, in id order.
func parseAddedDecoder(raw map[string]json.RawMessage) ([]addedToken, error) {
	out := make([]addedToken, 0, len(raw))
	for key, v := range raw {
		id, err := strconv.Atoi(key)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("[%q]: the key must be a token id", key)
		}
		at := addedToken{ID: id}
		if err := json.Unmarshal(v, &at); err != nil {
			return nil, fmt.Errorf("[%q]: %w", key, err)
		}
		at.ID = id
		if at.Content == "" {
			return nil, fmt.Errorf("[%q]: no content", key)
		}
		out = append(out, at)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// cleanUpTokenization is transformers' clean_up_tokenization: the same
// replacements in the same order.
func cleanUpTokenization(s string) string {
	for _, r := range [][2]string{
		{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
		{" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
	} {
		if strings.Contains(s, r[0]) {
			s = strings.ReplaceAll(s, r[0], r[1])
		}
	}
	return s
}
