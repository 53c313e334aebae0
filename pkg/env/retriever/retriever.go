package retriever

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/drmas/drmas/pkg/files"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/jsonl"
)

// Retriever types accepted by New.
const (
	TypeEmbedded = "embedded" // BM25 index on disk next to the corpus (or in IndexDir), reused across runs
	TypeMemory   = "memory"   // BM25 index in memory, built at each start (small corpora)
	TypeHTTP     = "http"     // Search-R1 retrieval server
)

// Run-config-only retriever types (not New's: pkg/train builds them).
const (
	TypeFacts = "facts" // a toy task's own facts (env.FactRetriever)
	TypeNone  = "none"  // no retriever
)

// RunTypes are the values a run config's retriever.type accepts (memory is for tests and tools).
var RunTypes = choice.NewSet("retriever type")

var (
	_ = RunTypes.Add(TypeEmbedded)
	_ = RunTypes.Add(TypeHTTP)
	_ = RunTypes.Add(TypeFacts)
	_ = RunTypes.Add(TypeNone)
)

// Defaults for Config's zero values.
const (
	DefaultTimeout  = 30 * time.Second
	DefaultRetries  = 3
	DefaultBackoff  = 250 * time.Millisecond
	DefaultLogEvery = 100_000
)

// Config selects and configures a retriever.
type Config struct {
	// Type is "embedded", "memory" or "http".
	Type string `json:"type" mapstructure:"type"`
	// Corpus is a JSON lines file of {"id": ..., "contents": ...} (embedded and memory).
	Corpus string `json:"corpus" mapstructure:"corpus"`
	// IndexDir is where the embedded index lives; empty means "<Corpus>.bleve".
	IndexDir string `json:"index_dir" mapstructure:"index_dir"`
	// URL is the retrieval server's endpoint, usually ending in /retrieve (http).
	URL string `json:"url" mapstructure:"url"`
	// Timeout bounds each HTTP attempt; 0 means DefaultTimeout.
	Timeout time.Duration `json:"timeout" mapstructure:"timeout"`
	// Retries is how many times an HTTP request is tried in all (network errors and 5xx replies are
	// tried again, 4xx replies are not); 0 means DefaultRetries, 1 means a single try.
	Retries int `json:"retries" mapstructure:"retries"`
	// Deadline keeps an HTTP request trying (past Retries) until this long after its first try, so
	// that a short outage of the server does not end a run; 0 means Retries alone decide.
	Deadline time.Duration `json:"deadline" mapstructure:"deadline"`
	// Backoff is the wait before the second try, doubled before each further one; 0 means DefaultBackoff.
	Backoff time.Duration `json:"backoff" mapstructure:"backoff"`
	// LogEvery is how many corpus documents pass between progress logs while indexing; 0 means
	// DefaultLogEvery.
	LogEvery int `json:"log_every" mapstructure:"log_every"`
}

// New builds the retriever cfg describes. The result also implements io.Closer; close it when done.
func New(cfg Config) (env.Retriever, error) {
	switch cfg.Type {
	case TypeEmbedded:
		e, err := OpenEmbedded(cfg)
		if err != nil {
			return nil, err
		}
		return e, nil
	case TypeMemory:
		if cfg.Corpus == "" {
			return nil, errors.New("retriever: type memory needs a corpus")
		}
		var docs []env.Doc
		if err := readCorpus(cfg.Corpus, func(d env.Doc) error {
			docs = append(docs, d)
			return nil
		}); err != nil {
			return nil, err
		}
		e, err := OpenMemory(docs)
		if err != nil {
			return nil, err
		}
		return e, nil
	case TypeHTTP:
		h, err := NewHTTP(cfg)
		if err != nil {
			return nil, err
		}
		return h, nil
	case "":
		return nil, errors.New("retriever: no type given (want embedded, memory or http)")
	}
	return nil, fmt.Errorf("retriever: unknown type %q (want embedded, memory or http)", cfg.Type)
}

// corpusLine is one line of a corpus file. Contents is a pointer so a missing field is told apart
// from an empty one.
type corpusLine struct {
	ID       json.RawMessage `json:"id"`
	Contents *string         `json:"contents"`
}

// readCorpus streams the documents of a JSON lines corpus in file order. A line without an id gets
// its 0-based document index as id; a line without contents, or one that is not a JSON object, is
// an error naming the file and line. An empty corpus is an error.
func readCorpus(path string, fn func(env.Doc) error) error {
	f, err := files.Open(path, 0)
	if err != nil {
		return fmt.Errorf("open corpus: %w", err)
	}
	defer f.Close()
	n := 0
	_, err = jsonl.Read(f, path, func(l jsonl.Line) error {
		d, err := parseCorpusLine(l.Text, n)
		if err != nil {
			return fmt.Errorf("%s:%d: %w", path, l.N, err)
		}
		n++
		return fn(d)
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("corpus %s is empty", path)
	}
	return nil
}

func parseCorpusLine(b []byte, idx int) (env.Doc, error) {
	var cl corpusLine
	if err := json.Unmarshal(b, &cl); err != nil {
		return env.Doc{}, fmt.Errorf("malformed corpus line: %w", err)
	}
	if cl.Contents == nil {
		return env.Doc{}, errors.New(`missing field "contents"`)
	}
	id, err := rawID(cl.ID)
	if err != nil {
		return env.Doc{}, err
	}
	if id == "" {
		id = strconv.Itoa(idx)
	}
	return env.Doc{ID: id, Contents: *cl.Contents}, nil
}

// rawID reads an id that may be a JSON string or number; absent or null gives "".
func rawID(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("id %s is neither a string nor a number", raw)
}
