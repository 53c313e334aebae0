package policy

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/drmas/drmas/pkg/llm"
)

// AddAdapter registers a on the policy under a.Name: requests whose Model is that name (Generate)
// or rows whose RowOptions.Adapter is (GenerateStream) run on it, in the same batches as the
// others. a must have been made for the policy's base; a name already registered is replaced (its
// old adapter is returned, for the caller to free once no generation uses it). Any goroutine.
func (p *Policy) AddAdapter(a *Adapter) (old *Adapter, err error) {
	root := p.Model.Base()
	if _, err := root.WithAdapter(a); err != nil {
		return nil, fmt.Errorf("policy %s: %w", p.ID, err)
	}
	if a.Name == "" || a.Name == p.ID {
		return nil, fmt.Errorf("policy %s: adapter name %q: want a name other than the policy's", p.ID, a.Name)
	}
	p.adapterMu.Lock()
	defer p.adapterMu.Unlock()
	if p.adapters == nil {
		p.adapters = map[string]*Adapter{}
	}
	old = p.adapters[a.Name]
	p.adapters[a.Name] = a
	return old, nil
}

// RemoveAdapter unregisters the adapter name and returns it (nil when there is none). Any goroutine.
func (p *Policy) RemoveAdapter(name string) *Adapter {
	p.adapterMu.Lock()
	defer p.adapterMu.Unlock()
	a := p.adapters[name]
	delete(p.adapters, name)
	return a
}

// LookupAdapter is the registered adapter name, or nil. Any goroutine.
func (p *Policy) LookupAdapter(name string) *Adapter {
	p.adapterMu.RLock()
	defer p.adapterMu.RUnlock()
	return p.adapters[name]
}

// AdapterNames lists the registered adapters, sorted. Any goroutine.
func (p *Policy) AdapterNames() []string {
	p.adapterMu.RLock()
	defer p.adapterMu.RUnlock()
	var out []string
	for n := range p.adapters {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// NewAdapterPolicy is the policy of adapter a on base's model: an adapted view (Model.WithAdapter)
// named id with base's tokenizer, chat template and settings. Its Parameters are a's; generation and
// scoring add a's low-rank terms. A Router batches the requests of policies on one base together.
func NewAdapterPolicy(id string, base *Policy, a *Adapter) (*Policy, error) {
	m, err := base.Model.Base().WithAdapter(a)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", id, err)
	}
	p, err := NewPolicy(id, m, base.Tok, base.Chat)
	if err != nil {
		return nil, err
	}
	p.StopIDs, p.PadID = slices.Clone(base.StopIDs), base.PadID
	p.MaxBatch, p.MicroBatch, p.SourceDir = base.MaxBatch, base.MicroBatch, base.SourceDir
	p.StaticBatching, p.KVTokens = base.StaticBatching, base.KVTokens
	p.layoutOf = base
	if base.layoutOf != nil {
		p.layoutOf = base.layoutOf
	}
	return p, nil
}

// generateGroup generates the requests of policies that share one base model in one batched call of
// lead: each row on its own policy's adapter (none for the base's policy). Prompts are encoded by
// each request's policy.
func generateGroup(ctx context.Context, lead *Policy, pols []*Policy, reqs []llm.Request) ([]llm.Completion, error) {
	prompts := make([][]int, len(reqs))
	settings := make([]llm.Sampling, len(reqs))
	adapters := make([]*Adapter, len(reqs))
	for i, r := range reqs {
		if len(r.Messages) == 0 {
			return nil, fmt.Errorf("policy %s: request %d (agent %s): no messages", pols[i].ID, i, r.Agent)
		}
		ids, err := pols[i].EncodePromptWith(r.Messages, r.ChatTemplateKwargs)
		if err != nil {
			return nil, fmt.Errorf("request %d (agent %s): %w", i, r.Agent, err)
		}
		prompts[i], settings[i], adapters[i] = ids, r.Sampling, pols[i].Model.Adapter()
	}
	return lead.generate(ctx, prompts, settings, nil, adapters)
}
