package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

// Policy is a model with its tokenizer and chat template: what an agent generates with and what
// training scores. It implements llm.Generator.
type Policy struct {
	ID      string
	Model   *Model
	Tok     *tokenizer.Tokenizer
	Chat    *tokenizer.ChatTemplate
	StopIDs []int // generation ends after any of these (kept in ResponseIDs)
	PadID   int   // fills the left padding of prompts (never attended to)
	Device  gotch.Device

	// MaxBatch caps the rows of generation in flight (0: all requests of a call at once). With
	// continuous batching (the default) a row that finishes frees its slot for the next waiting one
	// at the next step; StaticBatching runs batches of MaxBatch rows one after the other instead,
	// each to its end.
	MaxBatch       int
	StaticBatching bool
	// KVTokens caps generation's KV cache, in positions (rows in flight × cache columns; 0: no cap):
	// a waiting row starts only when the rows in flight and it fit, counting every row's prompt and
	// max_new_tokens in full. One row always runs, whatever its size.
	KVTokens int64
	// MicroBatch caps the rows of one forward in Score (0: all sequences at once).
	MicroBatch int
	// SourceDir is the folder the policy was loaded from, if any: Save copies its tokenizer
	// configuration and chat template files.
	SourceDir string

	decode *decodeClock // when set (benchmarks), decoding steps add their time and count here
	layout heldLayout   // the CPU decoding layout kept between batches (HoldDecodingLayout)
	// layoutOf is the policy whose decoding layout this one uses: an adapter's policy uses its
	// base's (NewAdapterPolicy); nil: its own.
	layoutOf *Policy

	adapterMu sync.RWMutex
	adapters  map[string]*Adapter // AddAdapter's, by name
}

// decodeClock accumulates the time and number of decoding steps (after the prefill) of generation.
type decodeClock struct {
	elapsed time.Duration
	steps   int
}

// TimeDecoding makes the policy's generation time its decoding steps (after the prefill, where they
// run: prefill and packing excluded), from now on; read returns their number and time so far
// (benchmarks). Not safe alongside a running generation.
func (p *Policy) TimeDecoding() (read func() (steps int, elapsed time.Duration)) {
	c := &decodeClock{}
	p.decode = c
	return func() (int, time.Duration) { return c.steps, c.elapsed }
}

// NewPolicy combines a model, a tokenizer and a chat template. The stop ids are the chat template's
// end-of-turn tokens and the model's eos_token_id(s); the padding id is pad_token_id, else the
// tokenizer's "<|endoftext|>", else the first stop id.
func NewPolicy(id string, m *Model, tok *tokenizer.Tokenizer, chat *tokenizer.ChatTemplate) (*Policy, error) {
	if m == nil || tok == nil || chat == nil {
		return nil, fmt.Errorf("policy %s: model, tokenizer and chat template are all required", id)
	}
	if tok.VocabSize() > m.Config.VocabSize {
		return nil, fmt.Errorf("policy %s: the tokenizer has %d tokens but the model's vocab_size is %d",
			id, tok.VocabSize(), m.Config.VocabSize)
	}
	p := &Policy{ID: id, Model: m, Tok: tok, Chat: chat, Device: m.device, PadID: -1}
	for _, s := range chat.EndOfTurn() {
		if tid, ok := tok.TokenID(s); ok {
			p.StopIDs = append(p.StopIDs, tid)
		} else {
			log.Warn().Str("policy", id).Str("token", s).Msg("end-of-turn token is not in the tokenizer; it cannot stop generation")
		}
	}
	for _, e := range m.Config.EOSTokenIDs {
		if e >= 0 && e < m.Config.VocabSize && !slices.Contains(p.StopIDs, e) {
			p.StopIDs = append(p.StopIDs, e)
		}
	}
	if len(p.StopIDs) == 0 {
		log.Warn().Str("policy", id).Msg("no end-of-turn or EOS token: generation ends only at max_new_tokens or a stop string")
	}
	switch pad, ok := tok.TokenID(tokenizer.EndOfText); {
	case m.Config.PadTokenID != nil && *m.Config.PadTokenID >= 0 && *m.Config.PadTokenID < m.Config.VocabSize:
		p.PadID = *m.Config.PadTokenID
	case ok:
		p.PadID = pad
	case len(p.StopIDs) > 0:
		p.PadID = p.StopIDs[0]
	default:
		p.PadID = 0
	}
	return p, nil
}

// LoadPolicy loads a Hugging Face model folder (config.json, weights, tokenizer.json and, if
// present, tokenizer_config.json with its chat template) as a policy named id. A toy folder with
// just config.json, model.safetensors and tokenizer.json gets the built-in template its tokens
// point to. Call it on the torch thread.
func LoadPolicy(id, dir string, dev gotch.Device, dtype gotch.DType) (*Policy, error) {
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	chat, err := tokenizer.LoadChatTemplate(dir)
	if err != nil {
		return nil, err
	}
	m, err := Load(dir, dev, dtype)
	if err != nil {
		return nil, err
	}
	p, err := NewPolicy(id, m, tok, chat)
	if err != nil {
		m.Free()
		return nil, err
	}
	p.SourceDir = dir
	return p, nil
}

// auxFiles are the files of a model folder that Save carries over from SourceDir.
var auxFiles = []string{"tokenizer_config.json", "chat_template.jinja", "chat_template.json",
	"generation_config.json", "special_tokens_map.json"}

// Save writes the model (config.json, model.safetensors) and tokenizer.json to dir, plus the
// tokenizer configuration and chat template files of SourceDir, so that LoadPolicy (and
// transformers) read the folder back as the same policy. Call it on the torch thread.
func (p *Policy) Save(dir string) error {
	if err := p.Model.Save(dir); err != nil {
		return err
	}
	if err := p.Tok.Save(filepath.Join(dir, "tokenizer.json")); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	if p.SourceDir == "" || filepath.Clean(p.SourceDir) == filepath.Clean(dir) {
		return nil
	}
	for _, name := range auxFiles {
		data, err := os.ReadFile(filepath.Join(p.SourceDir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("save %s: %w", dir, err)
		}
		if err := atomicfile.WriteBytes(filepath.Join(dir, name), data); err != nil {
			return fmt.Errorf("save %s: %w", dir, err)
		}
	}
	return nil
}
