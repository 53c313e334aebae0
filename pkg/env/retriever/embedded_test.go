package retriever

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
)

// fact is one generated key→value document.
type fact struct{ key, value string }

// randomWord makes a pronounceable-free random token that no English stemmer or stop list touches.
func randomWord(r *rand.Rand, n int) string {
	const letters = "bcdfghjklmnpqrstvwxz"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[r.IntN(len(letters))]
	}
	return string(b)
}

// writeCorpus writes n random facts as a JSON lines corpus and returns its path and the facts.
func writeCorpus(t *testing.T, dir string, n int, seed uint64) (string, []fact) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	facts := make([]fact, n)
	var buf bytes.Buffer
	for i := range facts {
		facts[i] = fact{key: randomWord(r, 8), value: fmt.Sprint(r.IntN(1_000_000))}
		line, _ := json.Marshal(map[string]string{
			"id":       fmt.Sprintf("doc-%d", i),
			"contents": fmt.Sprintf("The value of key %s is %s.", facts[i].key, facts[i].value),
		})
		buf.Write(line)
		buf.WriteByte('\n')
	}
	p := filepath.Join(dir, "corpus.jsonl")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, facts
}

// checkFacts asks for every key in one batch and wants its own document first.
func checkFacts(t *testing.T, r env.Retriever, facts []fact) {
	t.Helper()
	queries := make([]string, len(facts))
	for i, f := range facts {
		queries[i] = "what is the value of key " + f.key + "?"
	}
	res, err := r.Retrieve(context.Background(), queries, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(queries) {
		t.Fatalf("%d result lists for %d queries", len(res), len(queries))
	}
	for i, docs := range res {
		if len(docs) != 3 {
			t.Fatalf("query %d: %d docs, want 3", i, len(docs))
		}
		want := fmt.Sprintf("doc-%d", i)
		if docs[0].ID != want || !strings.Contains(docs[0].Contents, facts[i].value) {
			t.Fatalf("query %q: top doc %+v, want %s holding %s", queries[i], docs[0], want, facts[i].value)
		}
		if !(docs[0].Score > docs[1].Score && docs[1].Score >= docs[2].Score) {
			t.Errorf("query %d: scores not strictly best-first: %v %v %v", i, docs[0].Score, docs[1].Score, docs[2].Score)
		}
	}
}

func TestEmbeddedFindsFactsAndReusesIndex(t *testing.T) {
	dir := t.TempDir()
	corpus, facts := writeCorpus(t, dir, 200, 1)
	cfg := Config{Type: TypeEmbedded, Corpus: corpus}

	e, err := OpenEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Built() || e.Len() != 200 {
		t.Fatalf("first open: built=%v len=%d, want a fresh build of 200 docs", e.Built(), e.Len())
	}
	checkFacts(t, e, facts)
	probe := []string{facts[7].key + " value", "key value"}
	first, err := e.Retrieve(context.Background(), probe, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	markerPath := filepath.Join(corpus+".bleve", markerFile)
	before, err := os.Stat(markerPath)
	if err != nil {
		t.Fatal(err)
	}

	// Second open: the index is reused, not rebuilt.
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e2 := r.(*Embedded)
	if e2.Built() {
		t.Error("second open rebuilt the index; want reuse")
	}
	after, err := os.Stat(markerPath)
	if err != nil {
		t.Fatal(err)
	}
	if !after.ModTime().Equal(before.ModTime()) {
		t.Error("index marker rewritten on reuse")
	}
	checkFacts(t, e2, facts)
	again, err := e2.Retrieve(context.Background(), probe, 5)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, first) {
		t.Errorf("reused index answers differently:\n first %+v\n again %+v", first, again)
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}

	// A changed corpus forces a rebuild and the new facts are found.
	corpus2, facts2 := writeCorpus(t, dir, 50, 2)
	if corpus2 != corpus {
		t.Fatal("corpus path changed")
	}
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(corpus, future, future); err != nil {
		t.Fatal(err)
	}
	e3, err := OpenEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e3.Close()
	if !e3.Built() || e3.Len() != 50 {
		t.Fatalf("after corpus change: built=%v len=%d, want a rebuild of 50 docs", e3.Built(), e3.Len())
	}
	checkFacts(t, e3, facts2)
}

func TestEmbeddedRebuildsDamagedIndex(t *testing.T) {
	dir := t.TempDir()
	corpus, facts := writeCorpus(t, dir, 40, 3)
	idxDir := filepath.Join(dir, "idx")
	cfg := Config{Type: TypeEmbedded, Corpus: corpus, IndexDir: idxDir}
	e, err := OpenEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	if err := os.WriteFile(filepath.Join(idxDir, "index_meta.json"), []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	e2, err := OpenEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if !e2.Built() {
		t.Error("damaged index was reused")
	}
	checkFacts(t, e2, facts)
}

func TestEmbeddedRefusesForeignDir(t *testing.T) {
	dir := t.TempDir()
	corpus, _ := writeCorpus(t, dir, 5, 4)
	foreign := filepath.Join(dir, "notes")
	if err := os.MkdirAll(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(foreign, "keep.txt")
	if err := os.WriteFile(keep, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := OpenEmbedded(Config{Corpus: corpus, IndexDir: foreign})
	if err == nil || !strings.Contains(err.Error(), "not a bleve index") {
		t.Errorf("want a refusal, got %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("foreign file touched: %v", err)
	}
}

func TestEmbeddedLogsProgress(t *testing.T) {
	var buf bytes.Buffer
	old := log.Logger
	log.Logger = zerolog.New(&buf)
	defer func() { log.Logger = old }()

	corpus, _ := writeCorpus(t, t.TempDir(), 200, 5)
	e, err := OpenEmbedded(Config{Corpus: corpus, LogEvery: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var counts []int
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m struct {
			Msg  string `json:"message"`
			Docs int    `json:"docs"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m.Msg == "indexing corpus" {
			counts = append(counts, m.Docs)
		}
	}
	if fmt.Sprint(counts) != "[50 100 150 200]" {
		t.Errorf("progress logs at %v, want [50 100 150 200]", counts)
	}
}

func TestCorpusErrors(t *testing.T) {
	tests := []struct {
		name, content, want string
	}{
		{"malformed", "{\"id\":\"a\",\"contents\":\"x\"}\n{\"id\": \n", ":2: malformed corpus line"},
		{"missing contents", "{\"id\":\"a\",\"contents\":\"x\"}\n\n{\"id\":\"b\",\"text\":\"y\"}\n", `:3: missing field "contents"`},
		{"bad id", "{\"id\":[1],\"contents\":\"x\"}\n", ":1: id [1] is neither"},
		{"empty", "\n\n", " is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.jsonl")
			if err := os.WriteFile(p, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, typ := range []string{TypeEmbedded, TypeMemory} {
				_, err := New(Config{Type: typ, Corpus: p})
				if err == nil || !strings.Contains(err.Error(), p+tt.want) {
					t.Errorf("%s: error %v, want it to contain %q", typ, err, p+tt.want)
				}
			}
		})
	}
	missing := filepath.Join(t.TempDir(), "none.jsonl")
	for _, typ := range []string{TypeEmbedded, TypeMemory} {
		if _, err := New(Config{Type: typ, Corpus: missing}); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("%s: error %v, want it to name %s", typ, err, missing)
		}
	}
}

func TestMemoryCorpusFromFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.jsonl")
	content := "{\"contents\": \"alpha bravo\"}\n{\"id\": 7, \"contents\": \"charlie delta\"}\n"
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Type: TypeMemory, Corpus: p})
	if err != nil {
		t.Fatal(err)
	}
	defer r.(io.Closer).Close()
	res, err := r.Retrieve(context.Background(), []string{"delta", "bravo", "zulu", ""}, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(ids(res[0]), ids(res[1]), ids(res[2]), ids(res[3]))
	if got != "[7] [0] [] []" {
		t.Errorf("ids %s, want [7] [0] [] []", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("memory retriever wrote files: %v", entries)
	}
}

func ids(docs []env.Doc) []string {
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = d.ID
	}
	return out
}

// TestMemoryScoresAreBM25 checks the score against the BM25 formula (k1 1.2, b 0.75) on a corpus
// small enough to work out by hand, so a silent fallback to TF-IDF would fail.
func TestMemoryScoresAreBM25(t *testing.T) {
	e, err := OpenMemory([]env.Doc{
		{ID: "a", Contents: "zebra yak"},
		{ID: "b", Contents: "yak"},
		{ID: "c", Contents: "quokka"},
		{ID: "d", Contents: "quokka quokka yak"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	res, err := e.Retrieve(context.Background(), []string{"zebra"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(res[0]) != 1 || res[0][0].ID != "a" {
		t.Fatalf("got %+v, want doc a only", res[0])
	}
	// N = 4 docs, n = 1 holds "zebra", tf = 1, |a| = 2 tokens, avgdl = ceil(7/4) = 2.
	const k1, b = 1.2, 0.75
	idf := math.Log(1 + (4-1+0.5)/(1+0.5))
	want := idf * k1 / (1 + k1*(1-b+b*2.0/2.0))
	if got := res[0][0].Score; math.Abs(got-want) > 1e-6 {
		t.Errorf("score %v, want BM25 %v", got, want)
	}
}

func TestMemoryErrors(t *testing.T) {
	if _, err := OpenMemory(nil); err == nil {
		t.Error("empty corpus accepted")
	}
	if _, err := OpenMemory([]env.Doc{{ID: "x", Contents: "a"}, {ID: "x", Contents: "b"}}); err == nil || !strings.Contains(err.Error(), `duplicate document id "x"`) {
		t.Errorf("duplicate ids: %v", err)
	}
	if _, err := OpenMemory([]env.Doc{{Contents: "a"}}); err == nil {
		t.Error("empty id accepted")
	}
	e, err := OpenMemory([]env.Doc{{ID: "x", Contents: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.Retrieve(context.Background(), []string{"a"}, 0); err == nil {
		t.Error("topk 0 accepted")
	}
}

func TestNewConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Type: "faiss"},
		{Type: TypeEmbedded},
		{Type: TypeMemory},
		{Type: TypeHTTP},
		{Type: TypeHTTP, URL: "localhost:8000/retrieve"},
		{Type: TypeHTTP, URL: "http://x/retrieve", Retries: -1},
	} {
		if r, err := New(cfg); err == nil || r != nil {
			t.Errorf("New(%+v) = (%v, %v), want (nil, error)", cfg, r, err)
		}
	}
}
