package policy

import (
	"context"
	"fmt"
	"slices"

	"github.com/drmas/drmas/pkg/llm"
)

// Router sends each request to the policy named by its Model: a team whose agents run on several
// models. It implements llm.Generator. A request with no Model goes to the only policy, if there is
// just one.
type Router map[string]*Policy

// Generate groups the requests by model, lets each policy generate its group in one batched call
// (in the order the models first appear), and returns the completions aligned with reqs. Policies
// on one base model (adapters made by NewAdapterPolicy, and the base's own policy) form one group:
// their requests share batches, each row on its policy's adapter (multi-LoRA batching). Like
// Policy.Generate it enters torch.Do itself: call it from any goroutine but the torch thread.
func (r Router) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	var order []*Model
	groups := map[*Model][]int{}
	pols := make([]*Policy, len(reqs))
	for i, q := range reqs {
		id := q.Model
		if id == "" && len(r) == 1 {
			for only := range r {
				id = only
			}
		}
		p := r[id]
		if p == nil {
			return nil, fmt.Errorf("request %d (agent %s): no generator for model %q", i, q.Agent, q.Model)
		}
		pols[i] = p
		base := p.Model.Base()
		if _, ok := groups[base]; !ok {
			order = append(order, base)
		}
		groups[base] = append(groups[base], i)
	}
	out := make([]llm.Completion, len(reqs))
	for _, base := range order {
		idx := groups[base]
		sub := make([]llm.Request, len(idx))
		subPols := make([]*Policy, len(idx))
		lead := pols[idx[0]]
		for k, i := range idx {
			sub[k], subPols[k] = reqs[i], pols[i]
			if pols[i].Model == base { // the base's own policy leads: its decoding layout is the one held
				lead = pols[i]
			}
		}
		var got []llm.Completion
		var err error
		if len(slices.Compact(slices.Clone(subPols))) == 1 {
			got, err = lead.Generate(ctx, sub)
		} else {
			got, err = generateGroup(ctx, lead, subPols, sub)
		}
		if err != nil {
			return nil, err
		}
		if len(got) != len(sub) {
			return nil, fmt.Errorf("model %s: %d completions for %d requests", lead.ID, len(got), len(sub))
		}
		for k, i := range idx {
			out[i] = got[k]
		}
	}
	return out, nil
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
