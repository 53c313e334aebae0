package llm

import (
	"context"
	"fmt"
)

// Router sends each request to the generator of its Model (a team whose agents run on several
// models, in process or on serving engines). It implements Generator; a request with no Model goes
// to the only generator, if there is just one.
type Router map[string]Generator

// Generate groups the requests by model, lets each generator take its group in one call (in the
// order the models first appear) and returns the completions aligned with reqs.
func (r Router) Generate(ctx context.Context, reqs []Request) ([]Completion, error) {
	var order []string
	groups := map[string][]int{}
	for i, q := range reqs {
		id := q.Model
		if id == "" && len(r) == 1 {
			for only := range r {
				id = only
			}
		}
		if r[id] == nil {
			return nil, fmt.Errorf("request %d (agent %s): no generator for model %q", i, q.Agent, q.Model)
		}
		if _, ok := groups[id]; !ok {
			order = append(order, id)
		}
		groups[id] = append(groups[id], i)
	}
	out := make([]Completion, len(reqs))
	for _, id := range order {
		sub := make([]Request, len(groups[id]))
		for k, i := range groups[id] {
			sub[k] = reqs[i]
		}
		got, err := r[id].Generate(ctx, sub)
		if err != nil {
			return nil, err
		}
		if len(got) != len(sub) {
			return nil, fmt.Errorf("model %s: %d completions for %d requests", id, len(got), len(sub))
		}
		for k, i := range groups[id] {
			out[i] = got[k]
		}
	}
	return out, nil
}

// Concurrent is the router with each generator that can serve concurrent calls in shared batches
// (a local policy: continuous batching) as such; the others as they are (an engine's client
// batches on its server).
func (r Router) Concurrent() Generator {
	out := Router{}
	for id, g := range r {
		if c, ok := g.(interface{ Concurrent() Generator }); ok {
			g = c.Concurrent()
		}
		out[id] = g
	}
	return out
}
