package env

import "fmt"

// Opening is a prompt that can open an episode of a task: the first call's prompt text (the user
// message of its request) and the agent that makes it.
type Opening struct {
	Agent  *Agent
	Prompt string
}

// Openings renders the prompts that can open an episode of task t under o, one per way the episode
// can start: math, the Solver's first attempt; search, the turn-1 Verifier, and the Searcher when
// the curriculum can force a first search, each with and without the task's support facts when the
// curriculum can inject them; flow, the start step. Later prompts add the team's outputs, unknown
// before the run; these are what every episode of t sends first, so a prompt over the model's
// context among them fails every time t is drawn (the dataset check, pkg/train). Nil for an
// orchestra without openings.
func Openings(o Orchestra, t Task) ([]Opening, error) {
	op, ok := RuleOrchestra(o).(interface{ openings(t *Task) []pending })
	if !ok {
		return nil, nil
	}
	ps := op.openings(&t)
	out := make([]Opening, len(ps))
	for i, p := range ps {
		s, err := p.agent.Render(p.data)
		if err != nil {
			return nil, fmt.Errorf("task %s: %w", t.ID, err)
		}
		out[i] = Opening{Agent: p.agent, Prompt: s}
	}
	return out, nil
}

func (m *mathOrchestra) openings(t *Task) []pending {
	return []pending{{agent: m.solver, data: PromptData{Question: t.Question, Context: m.style.context(nil), Turn: 1,
		MaxTurns: m.cfg.MaxLoopNum}}}
}

func (o *searchOrchestra) openings(t *Task) []pending {
	contexts := []string{o.style.context(nil)}
	if c := o.cfg.Curriculum; c.Inject.P0 > 0 && len(t.Support) > 0 {
		contexts = append(contexts, o.style.context([]entry{{text: o.style.information(factDocs(t.Support))}}))
	}
	first := []*Agent{o.verifier}
	if o.cfg.Curriculum.ForceSearch.P0 > 0 {
		first = append(first, o.searcher)
	}
	var out []pending
	for _, a := range first {
		for _, c := range contexts {
			out = append(out, pending{agent: a, data: PromptData{Question: t.Question, Context: c, Turn: 1, MaxTurns: o.cfg.MaxTurns}})
		}
	}
	return out
}

func (o *flowOrchestra) openings(t *Task) []pending {
	return []pending{{agent: o.byName[o.flow.Start], data: PromptData{Question: t.Question, Context: o.style.context(nil),
		Turn: 1, MaxTurns: o.flow.MaxCalls}}}
}

// FirstPrompts are the prompts of task t as each agent gets it with an empty team context: the
// openings, then, for every agent, its prompt with the question alone at turn 1 (an agent that
// never opens an episode gets the team's outputs besides, which LaterTurns bounds). Nil for an
// orchestra without openings.
func FirstPrompts(o Orchestra, t Task) ([]Opening, error) {
	ops, err := Openings(o, t)
	if err != nil || ops == nil {
		return ops, err
	}
	tm, ok := RuleOrchestra(o).(interface{ members() (*team, int) })
	if !ok {
		return ops, nil
	}
	team, maxTurns := tm.members()
	for _, a := range team.agents {
		s, err := a.Render(PromptData{Question: t.Question, Context: team.style.context(nil), Turn: 1, MaxTurns: maxTurns})
		if err != nil {
			return nil, fmt.Errorf("task %s: %w", t.ID, err)
		}
		ops = append(ops, Opening{Agent: a, Prompt: s})
	}
	return ops, nil
}

func (m *mathOrchestra) members() (*team, int)   { return m.team, m.cfg.MaxLoopNum }
func (o *searchOrchestra) members() (*team, int) { return o.team, o.cfg.MaxTurns }
func (o *flowOrchestra) members() (*team, int)   { return o.team, o.flow.MaxCalls }

// LaterTurns bounds what later turns add to an agent's first prompt: at most calls earlier
// responses in the team's context (each written as Entry says, with the agent's name in place of
// %s and the response in place of %v) and one response under review. ok is false, with why, when a
// later prompt can also carry text of no known length (retrieved documents, tool results).
func LaterTurns(o Orchestra) (calls int, entry string, why string, ok bool) {
	entry = "The output of %q: %v\n"
	switch r := RuleOrchestra(o).(type) {
	case *mathOrchestra:
		if r.style.toy {
			entry = "%[2]v"
		}
		return 2*r.cfg.MaxLoopNum - 2, entry, fmt.Sprintf("math: at most %d earlier calls (max_loop_num %d)", 2*r.cfg.MaxLoopNum-2, r.cfg.MaxLoopNum), true
	case *flowOrchestra:
		for _, s := range r.flow.Steps {
			if s.Tool != "" || len(s.Tools) > 0 {
				return 0, "", fmt.Sprintf("flow: step %s's tool results have no bound", s.Agent), false
			}
		}
		if r.style.toy {
			entry = "%[2]v"
		}
		return r.flow.MaxCalls - 1, entry, fmt.Sprintf("flow: at most %d earlier calls (max_calls %d)", r.flow.MaxCalls-1, r.flow.MaxCalls), true
	case *searchOrchestra:
		return 0, "", "search: retrieved documents have no bound", false
	}
	return 0, "", "no bound known for this orchestra", false
}
