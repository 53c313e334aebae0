package tool

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/drmas/drmas/pkg/env"
)

// The built-in tools' names.
const (
	Lookup = "lookup" // a fact of the episode's task by its key (the toy tool team's only way to its answer)
	Search = "search" // the run's retriever: its top-k documents for a query
)

// Builtins are drmas's own tools, which Open puts first in a box: lookup (a fact of the call's task
// by its key: "k=v" facts, as the toy search task's) always, and search over Retriever, its TopK
// documents, when there is one.
type Builtins struct {
	Retriever env.Retriever
	TopK      int
}

// tools are the built-in tools b offers.
func (b Builtins) tools() []Tool {
	out := []Tool{{Name: Lookup, Description: "Look up the value of a key in the task's facts.",
		Parameters: stringParam("key", "the key, e.g. c"), Run: lookup}}
	if b.Retriever != nil {
		out = append(out, Tool{Name: Search, Description: "Search the knowledge base; returns the most relevant documents.",
			Parameters: stringParam("query", "the search query"), Run: b.search})
	}
	return out
}

// stringParam is the schema of an arguments object of one required string.
func stringParam(name, desc string) map[string]any {
	return map[string]any{"type": "object", "required": []any{name},
		"properties": map[string]any{name: map[string]any{"type": "string", "description": desc}}}
}

// lookup answers the task's fact whose key is the argument key ("c" finds "c=7").
func lookup(_ context.Context, task *env.Task, args json.RawMessage) (Output, error) {
	if task == nil {
		return Output{}, stopped(fmt.Errorf("tool %s: the call carries no task", Lookup))
	}
	key, failed := stringArg(args, "key")
	if failed != nil {
		return *failed, nil
	}
	for _, f := range task.Facts {
		if k, _, ok := strings.Cut(f, "="); ok && strings.TrimSpace(k) == strings.TrimSpace(key) {
			return Output{Text: f}, nil
		}
	}
	return Output{Text: fmt.Sprintf("no fact for key %q", key), IsError: true}, nil
}

// search answers the retriever's top-k documents for the argument query, for the call's task (a
// retriever that reads the task's own documents, env.TaskRetriever, is given it), one "Doc i: …"
// line each.
func (b Builtins) search(ctx context.Context, task *env.Task, args json.RawMessage) (Output, error) {
	q, failed := stringArg(args, "query")
	if failed != nil {
		return *failed, nil
	}
	var docs [][]env.Doc
	var err error
	if tr, ok := b.Retriever.(env.TaskRetriever); ok && task != nil {
		docs, err = tr.RetrieveTasks(ctx, []env.Task{*task}, []string{q}, b.TopK)
	} else {
		docs, err = b.Retriever.Retrieve(ctx, []string{q}, b.TopK)
	}
	if err != nil {
		return Output{}, err
	}
	if len(docs) != 1 {
		return Output{}, stopped(fmt.Errorf("tool %s: the retriever answered %d result lists for 1 query", Search, len(docs)))
	}
	return Output{Text: listDocs(docs[0][:min(b.TopK, len(docs[0]))])}, nil
}

// listDocs writes documents one "Doc i: contents" line each, as the tag form's <information> block
// lists them, without the tags.
func listDocs(docs []env.Doc) string {
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

// stringArg reads a string argument of a built-in tool (the schema has checked it is there); a
// failed read is the tool's failure, for the model.
func stringArg(args json.RawMessage, key string) (string, *Output) {
	var m map[string]any
	if err := json.Unmarshal(args, &m); err != nil {
		return "", &Output{Text: fmt.Sprintf("arguments are not a JSON object: %v", err), IsError: true}
	}
	v, ok := m[key].(string)
	if !ok {
		return "", &Output{Text: fmt.Sprintf("argument %q: a string is required", key), IsError: true}
	}
	return v, nil
}
