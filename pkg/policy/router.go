package policy

import (
	"context"

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
	g := make(llm.Router, len(r))
	for id, p := range r {
		g[id] = p
	}
	return g.Generate(ctx, reqs)
}

// HoldDecodingLayout holds every policy's decoding layout (Policy.HoldDecodingLayout) until the
// returned release is called: around a phase in which the weights do not change.
func (r Router) HoldDecodingLayout() (release func()) {
	var releases []func()
	for _, p := range r {
		releases = append(releases, p.HoldDecodingLayout())
	}
	return func() {
		for _, rel := range releases {
			rel()
		}
	}
}
