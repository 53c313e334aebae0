package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/drmas/drmas/pkg/env"
)

// SearchName is the name of the retriever's function tool.
const SearchName = "search"

// Search is the retriever as a function tool: search(query) returns the top topk documents, one
// "Doc i: contents" line each, as the tag form's <information> block lists them. The tag form
// (<search>…</search> in the search orchestra) is untouched; this is the same retriever for agents that
// call functions. A TaskRetriever (env.FactRetriever) searches the task WithTask put in the call's
// context, and refuses a call without one.
func Search(r env.Retriever, topk int) (Tool, error) {
	if r == nil {
		return Tool{}, errors.New("search tool: no retriever")
	}
	if topk < 1 {
		return Tool{}, fmt.Errorf("search tool: topk must be ≥ 1 (got %d)", topk)
	}
	return Tool{
		Name:        SearchName,
		Description: "Search the knowledge corpus and return the most relevant documents.",
		Parameters: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"query": map[string]any{"type": "string", "description": "The search query."},
			},
			"required": []any{"query"},
		},
		Run: func(ctx context.Context, args json.RawMessage) (Output, error) {
			var a struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(args, &a); err != nil {
				return Output{Text: "arguments: " + err.Error(), IsError: true}, nil
			}
			if strings.TrimSpace(a.Query) == "" {
				return Output{Text: "the query is empty", IsError: true}, nil
			}
			var docs [][]env.Doc
			var err error
			if tr, ok := r.(env.TaskRetriever); ok {
				task, ok := ctx.Value(taskKey{}).(env.Task)
				if !ok {
					return Output{}, stopped(errors.New("search tool: the retriever searches a task's own facts, and the call carries no task (tool.WithTask)"))
				}
				docs, err = tr.RetrieveTasks(ctx, []env.Task{task}, []string{a.Query}, topk)
			} else {
				docs, err = r.Retrieve(ctx, []string{a.Query}, topk)
			}
			if err != nil {
				return Output{}, fmt.Errorf("search: %w", err)
			}
			if len(docs) != 1 {
				return Output{}, stopped(fmt.Errorf("search: the retriever answered %d result lists for 1 query", len(docs)))
			}
			return Output{Text: formatDocs(docs[0][:min(topk, len(docs[0]))])}, nil
		},
	}, nil
}

// formatDocs lists documents as the tag form's <information> block does, without the tags.
func formatDocs(docs []env.Doc) string {
	if len(docs) == 0 {
		return "No documents found."
	}
	var b strings.Builder
	for i, d := range docs {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "Doc %d: %s", i+1, d.Contents)
	}
	return b.String()
}

type taskKey struct{}

// WithTask returns ctx carrying the episode's task, for a search tool over a TaskRetriever.
func WithTask(ctx context.Context, t env.Task) context.Context {
	return context.WithValue(ctx, taskKey{}, t)
}
