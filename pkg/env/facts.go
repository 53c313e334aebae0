package env

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// FactRetriever retrieves facts of the form "key=value" by their key: a fact whose whole key equals
// the query scores 2, one whose key words all or partly appear among the query's words scores the
// fraction that do; facts scoring 0 are not returned. A fact without '=' is all key. Matching is
// case-insensitive and ignores extra whitespace.
//
// It is a TaskRetriever: RetrieveTasks searches each task's own Facts (plus Corpus), which is how the
// toy search task keeps values that are redrawn per question out of reach of memorisation.
type FactRetriever struct {
	// Corpus holds facts shared by every query.
	Corpus []string
}

// Retrieve searches Corpus alone.
func (f FactRetriever) Retrieve(ctx context.Context, queries []string, topk int) ([][]Doc, error) {
	return f.RetrieveTasks(ctx, make([]Task, len(queries)), queries, topk)
}

// RetrieveTasks searches each task's Facts and Corpus; tasks is aligned with queries.
func (f FactRetriever) RetrieveTasks(ctx context.Context, tasks []Task, queries []string, topk int) ([][]Doc, error) {
	if len(tasks) != len(queries) {
		return nil, fmt.Errorf("fact retriever: %d tasks for %d queries", len(tasks), len(queries))
	}
	if topk < 1 {
		return nil, errors.New("fact retriever: topk must be ≥ 1")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([][]Doc, len(queries))
	for i, q := range queries {
		qw := strings.Fields(strings.ToLower(q))
		var docs []Doc
		for _, facts := range [][]string{tasks[i].Facts, f.Corpus} {
			for _, fact := range facts {
				key, _, _ := strings.Cut(fact, "=")
				if s := keyScore(qw, strings.Fields(strings.ToLower(key))); s > 0 {
					docs = append(docs, Doc{ID: strings.TrimSpace(key), Contents: fact, Score: s})
				}
			}
		}
		slices.SortStableFunc(docs, func(a, b Doc) int {
			switch {
			case a.Score > b.Score:
				return -1
			case a.Score < b.Score:
				return 1
			}
			return 0
		})
		out[i] = docs[:min(topk, len(docs))]
	}
	return out, nil
}

// keyScore scores a key against a query, both as lowercase words.
func keyScore(query, key []string) float64 {
	if len(key) == 0 || len(query) == 0 {
		return 0
	}
	if slices.Equal(query, key) {
		return 2
	}
	n := 0
	for _, w := range key {
		if slices.Contains(query, w) {
			n++
		}
	}
	return float64(n) / float64(len(key))
}
