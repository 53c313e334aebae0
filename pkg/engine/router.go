package engine

import "github.com/drmas/drmas/pkg/llm"

// Router sends each request to the generator of its Model: the in-process policy for a local model,
// a Client for a model served by an engine (llm.Router).
type Router = llm.Router
