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
