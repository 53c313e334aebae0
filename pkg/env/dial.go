package env

import (
	"context"
	"fmt"
	"time"

	"github.com/drmas/drmas/pkg/llm"
)

// dialRoles are the agents of the dial orchestra: the math Solver, and a Helper that checks the
// Solver's answer in the math Verifier's format.
var dialRoles = []Role{mathRoles[0], {Name: "helper", Parse: mathRoles[1].Parse, Prompts: mathRoles[1].Prompts}}

// DialConfig sets the dial orchestra's call pattern (orchestra.dial): after the Solver answers, the
// Helper is offered `calls` turns and takes each with probability p_wrong when the answer is wrong
// and p_right when it is right. The environment decides, not the policy, so the dial moves the
// Helper's mean reward μ_k away from the group's μ by a set amount (docs/dial.md).
type DialConfig struct {
	PWrong float64 `mapstructure:"p_wrong"`
	PRight float64 `mapstructure:"p_right"`
	Calls  int     `mapstructure:"calls"`
}

// DefaultDialConfig is the dial at rest: the Helper's calls do not depend on the outcome.
func DefaultDialConfig() DialConfig { return DialConfig{PWrong: 0.5, PRight: 0.5, Calls: 2} }

func (c DialConfig) validate() error {
	switch {
	case !(c.PWrong >= 0 && c.PWrong <= 1):
		return fmt.Errorf("orchestra.dial.p_wrong: must be in [0, 1] (got %g)", c.PWrong)
	case !(c.PRight >= 0 && c.PRight <= 1):
		return fmt.Errorf("orchestra.dial.p_right: must be in [0, 1] (got %g)", c.PRight)
	case c.Calls < 1 || c.Calls > 16:
		return fmt.Errorf("orchestra.dial.calls: must be in [1, 16] (got %d)", c.Calls)
	}
	return nil
}

// dialOrchestra is Solver, then 0…calls Helper checks chosen by the environment from whether the
// Solver's answer is right (DialConfig). The Helper's verdicts change nothing: the reward is the
// Solver's answer (answer.MathEqual), so under the team reward every Helper call carries the
// outcome of an episode it could not influence — the paper's search agent, called again and again
// in the episodes that fail, with the learning signal taken out. Its role reward, for role_weight
// > 0, is the math Verifier's: its verdict matched the truth.
type dialOrchestra struct {
	*team
	solver, helper *Agent
	dial           DialConfig
}

func newDial(s setup) (Orchestra, error) {
	t, err := newTeam("dial", s, dialRoles)
	if err != nil {
		return nil, err
	}
	return &dialOrchestra{team: t, solver: t.byName["solver"], helper: t.byName["helper"], dial: s.cfg.Dial}, nil
}

// Run plays n trajectories of every task.
func (d *dialOrchestra) Run(ctx context.Context, gen llm.Generator, tasks []Task, n int, opts RunOptions) (*Rollout, error) {
	began := time.Now()
	r, eps, err := d.start(tasks, n, opts, Schedule{})
	if err != nil {
		return nil, err
	}
	ps := make([]pending, len(eps))
	for i, e := range eps {
		ps[i] = pending{ep: e, agent: d.solver, data: PromptData{Question: e.task.Question, Turn: 1, MaxTurns: 1}}
	}
	idx, err := d.generate(ctx, gen, ps, opts)
	if err != nil {
		return nil, err
	}
	for i, e := range eps {
		solved(e, &e.traj.Calls[idx[i]])
	}
	for call := 1; call <= d.dial.Calls; call++ {
		ps = ps[:0]
		var called []*episode
		for _, e := range eps {
			p := d.dial.PRight
			if !e.correct {
				p = d.dial.PWrong
			}
			if draw(opts, fmt.Sprintf("dial/%d", call), e.traj) < p {
				called = append(called, e)
				ps = append(ps, pending{ep: e, agent: d.helper, data: PromptData{Question: e.task.Question,
					Context: d.style.context(e.entries), Response: e.last, Turn: call, MaxTurns: d.dial.Calls}})
			}
		}
		if idx, err = d.generate(ctx, gen, ps, opts); err != nil {
			return nil, err
		}
		for i, e := range called {
			checked(e, &e.traj.Calls[idx[i]])
		}
	}
	for _, e := range eps {
		d.finish(e, e.answer, e.answered, e.correct)
	}
	logRun(d.typ, r, began)
	return r, nil
}
