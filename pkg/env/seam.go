package env

import (
	"context"
	"encoding/json"
)

// Task is one question of a dataset: what the orchestra is asked and how its answer is judged.
type Task struct {
	ID       string   `json:"id"`
	Question string   `json:"question"`
	Answers  []string `json:"answers"` // gold answers; any match counts
	// Facts, when set, are task-specific documents (toy curricula inject them into the context).
	Facts []string `json:"facts,omitempty"`
	// Support, when set, lists the facts an answer needs (a subset of Facts or of the corpus). Role
	// rewards (a searcher's retrieval hit, a verifier's "enough information" verdict) and curricula
	// (injecting the needed fact) use it; without it they fall back to looking for a gold answer.
	Support []string `json:"support,omitempty"`
	// Record is the data record the task was read from, exactly as it stands in its file (JSON; a
	// Parquet row as JSON): what a gateway runner gets as the episode's task. Nil for a generated task.
	Record json.RawMessage `json:"-"`
}

// Doc is one retrieved document.
type Doc struct {
	ID       string  `json:"id"`
	Contents string  `json:"contents"`
	Score    float64 `json:"score"`
}

// Retriever answers a batch of search queries with the top-k documents of each.
type Retriever interface {
	Retrieve(ctx context.Context, queries []string, topk int) ([][]Doc, error)
}

// TaskRetriever is a Retriever whose corpus depends on the task (toy tasks keep theirs in Task.Facts).
// Orchestras call RetrieveTasks instead of Retrieve when their retriever implements it; tasks is
// aligned with queries.
type TaskRetriever interface {
	Retriever
	RetrieveTasks(ctx context.Context, tasks []Task, queries []string, topk int) ([][]Doc, error)
}
