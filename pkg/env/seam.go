// Package env holds the multi-agent side of drmas: agents, orchestras, tools, datasets and rewards.
//
// It talks to language models only through the Generator seam below, which pkg/policy implements
// and tests fake with scripted policies. It never imports libtorch.
package env

import "context"

// Message is one chat turn handed to a policy; the policy applies its own chat template.
type Message struct {
	Role    string `json:"role"` // "system", "user" or "assistant"
	Content string `json:"content"`
}

// Sampling holds the per-request decoding settings. Temperature 0 means greedy decoding.
type Sampling struct {
	Temperature  float64  `json:"temperature"`
	TopP         float64  `json:"top_p"`          // 0 or 1 = off
	TopK         int      `json:"top_k"`          // 0 = off
	MaxNewTokens int      `json:"max_new_tokens"` // must be > 0
	Stop         []string `json:"stop,omitempty"` // stop strings (the model's end-of-turn token always stops)
	Seed         int64    `json:"seed"`           // base seed; the policy derives per-row streams from it
}

// Request asks the policy playing Agent (on model Model) for one completion of Messages.
type Request struct {
	Agent    string
	Model    string
	Messages []Message
	Sampling Sampling
}

// Finish says why generation of one completion ended.
type Finish string

// Finish reasons.
const (
	FinishStop   Finish = "stop"   // end-of-turn token or a stop string
	FinishLength Finish = "length" // MaxNewTokens reached
)

// Completion is the policy's answer to one Request. ResponseIDs are exactly the sampled tokens (training
// uses them, never a re-encoding of Text) and LogProbs their log-probabilities under the sampling policy.
type Completion struct {
	Text        string
	PromptIDs   []int
	ResponseIDs []int
	LogProbs    []float32
	Finish      Finish
}

// Generator produces completions for a batch of requests; the result is aligned with reqs.
// Implementations must batch internally; orchestras hand each agent all its pending prompts at once.
type Generator interface {
	Generate(ctx context.Context, reqs []Request) ([]Completion, error)
}

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
