package retriever

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/blevesearch/bleve/v2"
	_ "github.com/blevesearch/bleve/v2/analysis/lang/en" // registers the "en" analyzer
	"github.com/blevesearch/bleve/v2/index/scorch"
	"github.com/blevesearch/bleve/v2/mapping"
	"github.com/blevesearch/bleve/v2/search"
	index "github.com/blevesearch/bleve_index_api"
	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
)

const (
	// contentsField is the indexed (and stored) text field of each document.
	contentsField = "contents"
	// analyzer is bleve's English analyzer (lowercase, stop words, possessives, Porter stemming),
	// close to the Lucene English analyzer that Pyserini's BM25 (Search-R1's sparse baseline) uses.
	analyzer = "en"
	// markerFile records which corpus an on-disk index was built from; it is written last, so an
	// index without it is an unfinished build.
	markerFile = "drmas-index.json"
	// markerVersion changes whenever the index layout or analysis changes, forcing a rebuild.
	markerVersion = 1
	indexBatch    = 1000
)

// Embedded is a BM25 full-text index over a corpus, on disk or in memory. It is safe for
// concurrent use.
//
// Scores are standard BM25 (k1 = 1.2, b = 0.75, idf = ln(1 + (N − n + 0.5)/(n + 0.5))) with the
// average document length taken as ceil(tokens / documents). bleve on its own would use the number
// of distinct terms instead of tokens (its FieldCardinality), which for a real corpus makes the
// average length about 1 and over-penalizes every longer passage; Embedded counts the tokens while
// indexing and hands bleve the right statistics with each search.
type Embedded struct {
	idx   bleve.Index
	dir   string // "" when in memory
	built bool
	docs  uint64
	stats *search.BM25Stats
}

// newEmbedded wraps an open index whose contents field holds tokens tokens over docs documents.
func newEmbedded(idx bleve.Index, dir string, docs, tokens uint64) *Embedded {
	return &Embedded{idx: idx, dir: dir, docs: docs, stats: &search.BM25Stats{
		DocCount:         float64(docs),
		FieldCardinality: map[string]int{contentsField: int(tokens)},
	}}
}

// marker is the content of markerFile.
type marker struct {
	Version  int    `json:"version"`
	Corpus   string `json:"corpus"`
	Size     int64  `json:"size"`
	ModTime  int64  `json:"mod_time_ns"`
	Docs     uint64 `json:"docs"`
	Tokens   uint64 `json:"tokens"`
	Analyzer string `json:"analyzer"`
	Scoring  string `json:"scoring"`
}

// newMapping indexes only the contents field, stored for retrieval, and scores with BM25
// (k1 = 1.2, b = 0.75; bleve's default would be TF-IDF).
func newMapping() mapping.IndexMapping {
	f := bleve.NewTextFieldMapping()
	f.Analyzer = analyzer
	f.Store = true
	f.IncludeTermVectors = false
	f.IncludeInAll = false
	dm := bleve.NewDocumentStaticMapping()
	dm.AddFieldMappingsAt(contentsField, f)
	im := bleve.NewIndexMapping()
	im.DefaultMapping = dm
	im.DefaultAnalyzer = analyzer
	im.ScoringModel = index.BM25Scoring
	return im
}

// OpenEmbedded opens the on-disk BM25 index of cfg.Corpus in cfg.IndexDir (default
// "<corpus>.bleve"), building it first when it is missing, was built from a different version of
// the corpus (size or modification time changed), or cannot be opened. A build logs its progress
// every cfg.LogEvery documents and replaces the old index only once complete. It refuses to
// replace a directory that does not hold a bleve index. Two processes must not build the same
// index at the same time (they would share the scratch directory "<IndexDir>.building").
func OpenEmbedded(cfg Config) (*Embedded, error) {
	if cfg.Corpus == "" {
		return nil, errors.New("retriever: type embedded needs a corpus")
	}
	dir := cfg.IndexDir
	if dir == "" {
		dir = cfg.Corpus + ".bleve"
	}
	st, err := os.Stat(cfg.Corpus)
	if err != nil {
		return nil, fmt.Errorf("open corpus: %w", err)
	}
	abs, err := filepath.Abs(cfg.Corpus)
	if err != nil {
		return nil, fmt.Errorf("open corpus: %w", err)
	}
	want := marker{Version: markerVersion, Corpus: abs, Size: st.Size(), ModTime: st.ModTime().UnixNano(),
		Analyzer: analyzer, Scoring: index.BM25Scoring}

	if e, reason := openExisting(dir, want); e != nil {
		log.Info().Str("index", dir).Uint64("docs", e.docs).Msg("reusing BM25 index")
		return e, nil
	} else if reason != "" {
		log.Info().Str("index", dir).Str("reason", reason).Msg("rebuilding BM25 index")
	}
	if err := build(cfg, dir, want); err != nil {
		return nil, err
	}
	e, reason := openExisting(dir, want)
	if e == nil {
		return nil, fmt.Errorf("retriever: index %s unusable right after building it: %s", dir, reason)
	}
	e.built = true
	return e, nil
}

// openExisting opens the index in dir if its marker matches want. Otherwise it returns nil and
// why ("" when there is no index at all).
func openExisting(dir string, want marker) (*Embedded, string) {
	b, err := os.ReadFile(filepath.Join(dir, markerFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, statErr := os.Stat(dir); errors.Is(statErr, os.ErrNotExist) {
			return nil, ""
		}
		return nil, "no completed build found"
	}
	if err != nil {
		return nil, err.Error()
	}
	var got marker
	if err := json.Unmarshal(b, &got); err != nil {
		return nil, "damaged marker: " + err.Error()
	}
	docs, tokens := got.Docs, got.Tokens
	got.Docs, got.Tokens = 0, 0
	if got != want {
		return nil, "corpus or index settings changed since the index was built"
	}
	idx, err := bleve.Open(dir)
	if err != nil {
		return nil, "cannot open index: " + err.Error()
	}
	n, err := idx.DocCount()
	if err != nil || n != docs {
		_ = idx.Close()
		return nil, fmt.Sprintf("index holds %d documents, marker says %d (err %v)", n, docs, err)
	}
	return newEmbedded(idx, dir, n, tokens), ""
}

// build indexes the corpus into a scratch directory and moves it to dir once complete.
func build(cfg Config, dir string, m marker) error {
	if err := checkReplaceable(dir); err != nil {
		return err
	}
	tmp := dir + ".building"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("retriever: clear %s: %w", tmp, err)
	}
	idx, err := bleve.New(tmp, newMapping())
	if err != nil {
		return fmt.Errorf("retriever: create index %s: %w", tmp, err)
	}
	every := cfg.LogEvery
	if every <= 0 {
		every = DefaultLogEvery
	}
	start := time.Now()
	log.Info().Str("corpus", cfg.Corpus).Str("index", dir).Msg("building BM25 index")
	n, tokens, err := indexCorpus(idx, cfg.Corpus, every, start)
	m.Tokens = tokens
	if err == nil {
		m.Docs, err = idx.DocCount()
	}
	if closeErr := idx.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("retriever: close index %s: %w", tmp, closeErr)
	}
	if err == nil {
		err = writeMarker(tmp, m)
	}
	if err == nil {
		if err = os.RemoveAll(dir); err == nil {
			err = os.Rename(tmp, dir)
		}
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if m.Docs != uint64(n) {
		log.Warn().Int("lines", n).Uint64("docs", m.Docs).Msg("corpus has duplicate ids; later lines replaced earlier ones")
	}
	log.Info().Str("index", dir).Uint64("docs", m.Docs).Dur("took", time.Since(start)).Msg("built BM25 index")
	return nil
}

// indexCorpus adds every corpus document to idx in batches and returns how many it read and
// how many tokens their contents hold.
func indexCorpus(idx bleve.Index, corpus string, every int, start time.Time) (int, uint64, error) {
	count, err := tokenCounter()
	if err != nil {
		return 0, 0, err
	}
	batch := idx.NewBatch()
	n, tokens := 0, uint64(0)
	flush := func() error {
		if batch.Size() == 0 {
			return nil
		}
		if err := idx.Batch(batch); err != nil {
			return fmt.Errorf("retriever: index %s: %w", corpus, err)
		}
		batch.Reset()
		return nil
	}
	err = readCorpus(corpus, func(d env.Doc) error {
		if err := batch.Index(d.ID, map[string]any{contentsField: d.Contents}); err != nil {
			return fmt.Errorf("retriever: index document %q: %w", d.ID, err)
		}
		tokens += count(d.Contents)
		n++
		if batch.Size() >= indexBatch {
			if err := flush(); err != nil {
				return err
			}
		}
		if n%every == 0 {
			el := time.Since(start)
			log.Info().Int("docs", n).Dur("elapsed", el).
				Float64("docs_per_s", float64(n)/el.Seconds()).Msg("indexing corpus")
		}
		return nil
	})
	if err != nil {
		return n, tokens, err
	}
	return n, tokens, flush()
}

// tokenCounter returns a function counting the tokens the index's analyzer makes of a text, which
// is the document length BM25 uses.
func tokenCounter() (func(string) uint64, error) {
	a := newMapping().AnalyzerNamed(analyzer)
	if a == nil {
		return nil, fmt.Errorf("retriever: analyzer %q is not registered", analyzer)
	}
	return func(s string) uint64 { return uint64(len(a.Analyze([]byte(s)))) }, nil
}

func writeMarker(dir string, m marker) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("retriever: encode index marker: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, markerFile), b, 0o644); err != nil {
		return fmt.Errorf("retriever: write index marker: %w", err)
	}
	return nil
}

// checkReplaceable refuses to delete a directory that is neither empty nor a bleve index, so a
// mistyped IndexDir cannot wipe unrelated files.
func checkReplaceable(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("retriever: index dir %s: %w", dir, err)
	}
	for _, e := range entries {
		if n := e.Name(); n == markerFile || n == "index_meta.json" {
			return nil
		}
	}
	if len(entries) > 0 {
		return fmt.Errorf("retriever: index dir %s exists and is not a bleve index; refusing to replace it", dir)
	}
	return nil
}

// OpenMemory builds an in-memory BM25 index over docs (IDs must be unique and non-empty).
func OpenMemory(docs []env.Doc) (*Embedded, error) {
	if len(docs) == 0 {
		return nil, errors.New("retriever: in-memory corpus is empty")
	}
	idx, err := bleve.NewUsing("", newMapping(), scorch.Name, scorch.Name, nil)
	if err != nil {
		return nil, fmt.Errorf("retriever: create in-memory index: %w", err)
	}
	count, err := tokenCounter()
	if err != nil {
		_ = idx.Close()
		return nil, err
	}
	seen := make(map[string]struct{}, len(docs))
	batch := idx.NewBatch()
	tokens := uint64(0)
	for i, d := range docs {
		if d.ID == "" {
			_ = idx.Close()
			return nil, fmt.Errorf("retriever: document %d has an empty id", i)
		}
		if _, dup := seen[d.ID]; dup {
			_ = idx.Close()
			return nil, fmt.Errorf("retriever: duplicate document id %q", d.ID)
		}
		seen[d.ID] = struct{}{}
		tokens += count(d.Contents)
		if err := batch.Index(d.ID, map[string]any{contentsField: d.Contents}); err != nil {
			_ = idx.Close()
			return nil, fmt.Errorf("retriever: index document %q: %w", d.ID, err)
		}
	}
	if err := idx.Batch(batch); err != nil {
		_ = idx.Close()
		return nil, fmt.Errorf("retriever: build in-memory index: %w", err)
	}
	e := newEmbedded(idx, "", uint64(len(docs)), tokens)
	e.built = true
	return e, nil
}

// Built reports whether opening built the index (false when an existing one was reused).
func (e *Embedded) Built() bool { return e.built }

// Len is the number of documents in the index.
func (e *Embedded) Len() int { return int(e.docs) }

// Retrieve returns, for each query, up to topk documents by descending BM25 score (ties by id).
// Queries run concurrently; a query with no matching term gets an empty list.
func (e *Embedded) Retrieve(ctx context.Context, queries []string, topk int) ([][]env.Doc, error) {
	if topk <= 0 {
		return nil, fmt.Errorf("retriever: topk %d, want > 0", topk)
	}
	out := make([][]env.Doc, len(queries))
	errs := make([]error, len(queries))
	workers := min(runtime.GOMAXPROCS(0), len(queries))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i], errs[i] = e.search(ctx, queries[i], topk)
			}
		}()
	}
	for i := range queries {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("retriever: query %d %q: %w", i, queries[i], err)
		}
	}
	return out, nil
}

func (e *Embedded) search(ctx context.Context, q string, topk int) ([]env.Doc, error) {
	mq := bleve.NewMatchQuery(q)
	mq.SetField(contentsField)
	req := bleve.NewSearchRequestOptions(mq, topk, 0, false)
	req.Fields = []string{contentsField}
	req.SortBy([]string{"-_score", "_id"})
	req.PreSearchData = map[string]any{search.BM25PreSearchDataKey: e.stats}
	res, err := e.idx.SearchInContext(ctx, req)
	if err != nil {
		return nil, err
	}
	docs := make([]env.Doc, 0, len(res.Hits))
	for _, h := range res.Hits {
		text, _ := h.Fields[contentsField].(string)
		docs = append(docs, env.Doc{ID: h.ID, Contents: text, Score: h.Score})
	}
	return docs, nil
}

// Close releases the index.
func (e *Embedded) Close() error {
	if err := e.idx.Close(); err != nil {
		return fmt.Errorf("retriever: close index %s: %w", e.dir, err)
	}
	return nil
}
