package env

import (
	"context"
	"time"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/drmas/drmas/pkg/env/answer"
)

// mathRoles are the agents of the math orchestra.
var mathRoles = []Role{
	{Name: "solver", Parse: BoxedParser,
		Prompts: map[string]string{PromptsPaper: mathSolverPaper, PromptsToy: mathSolverToy}},
	{Name: "verifier", Parse: TagParser("verify", VerdictApprove, VerdictReject),
		Prompts: map[string]string{PromptsPaper: mathVerifierPaper, PromptsToy: mathVerifierToy}},
}

// mathOrchestra is Solver → Verifier: on reject the Solver retries, up to max_loop_num Solver calls,
// and the Verifier does not run after the last one (S,V or S,V,S with the default 2). An unparseable
// verdict counts as approve and is an invalid call. The final answer is the \boxed{} of the Solver's
// last response; the reward is 1 when it equals a gold answer (answer.MathEqual).
type mathOrchestra struct {
	*team
	solver, verifier *Agent
}

func newMath(s setup) (Orchestra, error) {
	t, err := newTeam("math", s, mathRoles)
	if err != nil {
		return nil, err
	}
	return &mathOrchestra{team: t, solver: t.byName["solver"], verifier: t.byName["verifier"]}, nil
}

// Run plays n trajectories of every task.
func (m *mathOrchestra) Run(ctx context.Context, gen llm.Generator, tasks []Task, n int, opts RunOptions) (*Rollout, error) {
	began := time.Now()
	r, active, err := m.start(tasks, n, opts, Schedule{})
	if err != nil {
		return nil, err
	}
	maxLoop := m.cfg.MaxLoopNum
	for loop := 1; len(active) > 0; loop++ {
		ps := make([]pending, len(active))
		for i, e := range active {
			ps[i] = pending{ep: e, agent: m.solver, data: PromptData{Question: e.task.Question,
				Context: m.style.context(e.entries), Turn: loop, MaxTurns: maxLoop}}
		}
		idx, err := m.generate(ctx, gen, ps, opts)
		if err != nil {
			return nil, err
		}
		for i, e := range active {
			solved(e, &e.traj.Calls[idx[i]])
		}
		if loop == maxLoop {
			for _, e := range active {
				m.finish(e, e.answer, e.answered, e.correct)
			}
			break
		}

		for i, e := range active {
			ps[i] = pending{ep: e, agent: m.verifier, data: PromptData{Question: e.task.Question,
				Context: m.style.context(e.entries), Response: e.last, Turn: loop, MaxTurns: maxLoop}}
		}
		if idx, err = m.generate(ctx, gen, ps, opts); err != nil {
			return nil, err
		}
		active = m.finishWhere(active, func(i int, e *episode) bool { // approved: done
			c := &e.traj.Calls[idx[i]]
			approve := checked(e, c)
			e.entries = append(e.entries, entry{agent: m.verifier.Name, text: c.Response, verdict: true})
			return approve
		})
	}
	logRun(m.typ, r, began)
	return r, nil
}

// solved records a Solver call in its episode: its answer, whether it is right (the call's role
// reward) and its response in the team's context.
func solved(e *episode, c *Call) {
	e.answer, e.answered = c.Parsed, c.Valid
	e.correct = c.Valid && anyMatch(answer.MathEqual, c.Parsed, e.task.Answers)
	c.RoleReward = b2f(e.correct)
	e.last = c.Response
	e.entries = append(e.entries, entry{agent: c.Agent, text: c.Response})
}

// checked scores a verdict on the episode's latest answer: the call's role reward is whether it
// matched the truth. It reports whether the verdict approves (an unparseable one does).
func checked(e *episode, c *Call) (approve bool) {
	approve = !c.Valid || c.Parsed == VerdictApprove
	c.RoleReward = b2f(c.Valid && approve == e.correct)
	return approve
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
