package tool

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/retriever"
)

func TestSearch(t *testing.T) {
	idx, err := retriever.OpenMemory([]env.Doc{
		{ID: "1", Contents: "Paris is the capital of France."},
		{ID: "2", Contents: "Berlin is the capital of Germany."},
		{ID: "3", Contents: "The Rhine flows through Germany."},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	search, err := Search(idx, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Settings{}, search)
	if err != nil {
		t.Fatal(err)
	}
	def, _ := json.Marshal(b.Definitions())
	if want := `[{"function":{"description":"Search the knowledge corpus and return the most relevant documents.","name":"search",` +
		`"parameters":{"properties":{"query":{"description":"The search query.","type":"string"}},"required":["query"],"type":"object"}},"type":"function"}]`; string(def) != want {
		t.Errorf("definition %s", def)
	}
	// The same documents, in the same order, as the retriever gives the tag form.
	docs, err := idx.Retrieve(context.Background(), []string{"capital of Germany"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	res := call(t, b, "search", `{"query": "capital of Germany"}`)
	want := "Doc 1: " + docs[0][0].Contents + "\nDoc 2: " + docs[0][1].Contents
	if !res.OK() || res.Text != want || !strings.HasPrefix(res.Text, "Doc 1: Berlin") {
		t.Errorf("search: %+v; want %q", res, want)
	}
	if res := call(t, b, "search", `{"q": "x"}`); res.Failure != BadArguments || !strings.Contains(res.Reason, "query") {
		t.Errorf("search without a query: %+v", res)
	}
	if res := call(t, b, "search", `{"query": "  "}`); res.Failure != ToolError {
		t.Errorf("an empty query: %+v", res)
	}
	if res := call(t, b, "search", `{"query": "zebra"}`); !res.OK() || res.Text != "No documents found." {
		t.Errorf("no match: %+v", res)
	}
}

// TestSearchTask: over a TaskRetriever, the search tool searches the task in the call's context.
func TestSearchTask(t *testing.T) {
	search, err := Search(env.FactRetriever{Corpus: []string{"moon=white"}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(Settings{Retries: 1}, search)
	ctx := WithTask(context.Background(), env.Task{Facts: []string{"color of the sky=green"}})
	res, err := b.Call(ctx, Call{Name: "search", Arguments: json.RawMessage(`{"query": "color of the sky"}`)})
	if err != nil || res.Text != "Doc 1: color of the sky=green" {
		t.Errorf("search: %+v %v", res, err)
	}
	if _, err := b.Call(context.Background(), Call{Name: "search", Arguments: json.RawMessage(`{"query": "moon"}`)}); err == nil ||
		!strings.Contains(err.Error(), "carries no task") {
		t.Errorf("a call without a task: %v", err)
	}
	if _, err := Search(nil, 3); err == nil {
		t.Error("no retriever accepted")
	}
}
