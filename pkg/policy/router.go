package policy

import (
	"context"
	"fmt"

	"github.com/drmas/drmas/pkg/llm"
)

// Router sends each request to the policy named by its Model: a team whose agents run on several
// models. It implements llm.Generator. A request with no Model goes to the only policy, if there is
// just one.
type Router map[string]*Policy

// Generate groups the requests by model, lets each policy generate its group in one batched call
// (in the order the models first appear), and returns the completions aligned with reqs. Like
// Policy.Generate it enters torch.Do itself: call it from any goroutine but the torch thread.
func (r Router) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
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
			return nil, fmt.Errorf("request %d (agent %s): no policy for model %q", i, q.Agent, q.Model)
		}
		if _, ok := groups[id]; !ok {
			order = append(order, id)
		}
		groups[id] = append(groups[id], i)
	}
	out := make([]llm.Completion, len(reqs))
	for _, id := range order {
		sub := make([]llm.Request, len(groups[id]))
		for k, i := range groups[id] {
			sub[k] = reqs[i]
		}
		got, err := r[id].Generate(ctx, sub)
		if err != nil {
			return nil, err
		}
		for k, i := range groups[id] {
			out[i] = got[k]
		}
	}
	return out, nil
}
