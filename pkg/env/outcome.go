package env

import (
	"context"
	"errors"
	"fmt"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/drmas/drmas/pkg/env/answer"
)

// OutcomeReward gives the finished trajectories of a rollout their team reward in place of the
// orchestra's rule checker: an LLM judge or a remote endpoint (pkg/judge). It sees the whole rollout
// at once, so that it can send all its questions concurrently and in batches.
type OutcomeReward interface {
	// Outcomes returns one outcome per trajectory of r, aligned with r.Trajectories, and the counts of
	// what it did. rule tells what the orchestra's own checker makes of a trajectory's final answer.
	// An error fails the rollout (and so the iteration).
	Outcomes(ctx context.Context, r *Rollout, rule RuleCheck) ([]Outcome, RewardStats, error)
}

// RuleCheck is the orchestra's rule checker on a trajectory's final answer: whether it is right and
// whether the rule could tell (answer.MathDecide, answer.QADecide). A trajectory without an answer
// is decided and wrong.
type RuleCheck func(tr *Trajectory) (correct, decided bool)

// Outcome is one trajectory's outcome under an OutcomeReward.
type Outcome struct {
	Reward  float64 // the team's outcome reward
	Success bool    // whether it counts as solved (avg@k, pass@k)
	// CallScores, when set (one per call), are the calls' scores before the invalid-action penalty in
	// place of (1 − w)·Reward + w·RoleReward: a remote endpoint's per-call scores.
	CallScores []float64
}

// RewardStats are what an OutcomeReward did for one rollout, as counters keyed by their
// metrics.jsonl keys (reward/judge/calls, reward/remote/failures …: pkg/metric); training writes
// them as they are, so a new reward's counters need no change outside it.
type RewardStats map[string]float64

// Add sums two counts (the shares of several ranks).
func (s RewardStats) Add(o RewardStats) RewardStats {
	out := RewardStats{}
	for k, v := range s {
		out[k] += v
	}
	for k, v := range o {
		out[k] += v
	}
	return out
}

// rewarded is an orchestra whose team reward comes from an OutcomeReward.
type rewarded struct {
	Orchestra
	t  *team
	rw OutcomeReward
}

// WithOutcomeReward returns the orchestra with its team reward given by rw once the episodes of a
// rollout finish: every call's score is recomputed from the new reward (role rewards stay the
// orchestra's), Rollout.RewardStats holds rw's counts. Training, validation and `drmas eval` all see
// the new reward.
func WithOutcomeReward(o Orchestra, rw OutcomeReward) (Orchestra, error) {
	b, ok := o.(interface{ base() *team })
	if !ok {
		return nil, fmt.Errorf("reward: orchestra %T takes no outcome reward", o)
	}
	if rw == nil {
		return nil, errors.New("reward: no outcome reward")
	}
	return &rewarded{Orchestra: o, t: b.base(), rw: rw}, nil
}

// RuleOrchestra returns the orchestra under an outcome reward (o itself when it has none): the format
// warm-up's demonstrations need no reward.
func RuleOrchestra(o Orchestra) Orchestra {
	if w, ok := o.(*rewarded); ok {
		return w.Orchestra
	}
	return o
}

// Run plays the episodes with the orchestra, then asks the outcome reward for every trajectory's reward.
func (w *rewarded) Run(ctx context.Context, gen llm.Generator, tasks []Task, n int, opts RunOptions) (*Rollout, error) {
	r, err := w.Orchestra.Run(ctx, gen, tasks, n, opts)
	if err != nil {
		return nil, err
	}
	outs, stats, err := w.rw.Outcomes(ctx, r, func(tr *Trajectory) (bool, bool) { return w.t.rule(r, tr) })
	if err != nil {
		return nil, fmt.Errorf("reward: %w", err)
	}
	if len(outs) != len(r.Trajectories) {
		return nil, fmt.Errorf("reward: %d outcomes for %d trajectories", len(outs), len(r.Trajectories))
	}
	for i := range r.Trajectories {
		tr := &r.Trajectories[i]
		if cs := outs[i].CallScores; cs != nil && len(cs) != len(tr.Calls) {
			return nil, fmt.Errorf("reward: trajectory %s: %d call scores for %d calls", tr.TrajUID, len(cs), len(tr.Calls))
		}
		tr.Reward, tr.Success = outs[i].Reward, outs[i].Success
		w.t.score(tr, outs[i].CallScores)
	}
	r.RewardStats = stats
	return r, nil
}

func (t *team) base() *team { return t }

// rule is the orchestra's checker on a trajectory's final answer.
func (t *team) rule(r *Rollout, tr *Trajectory) (correct, decided bool) {
	if !tr.Answered || tr.TaskIndex < 0 || tr.TaskIndex >= len(r.Tasks) {
		return false, true
	}
	golds := r.Tasks[tr.TaskIndex].Answers
	if t.matcher() == MatchQA {
		return answer.QADecide(tr.Answer, golds)
	}
	return answer.MathDecide(tr.Answer, golds)
}

// matcher is how the orchestra judges final answers: MatchMath or MatchQA.
func (t *team) matcher() string {
	switch t.typ {
	case "search":
		return MatchQA
	case "flow":
		return t.cfg.Flow.Match
	}
	return MatchMath
}

// score sets every call's score from the trajectory's reward: the given scores, when set, else
// (1 − w)·reward + w·role; minus the penalty for an invalid call.
func (t *team) score(tr *Trajectory, given []float64) {
	tr.Score(func(agent string) float64 { return t.byName[agent].RoleWeight }, t.penalty, given)
}

// Score scores every call of the trajectory: given[i] when given (an outcome reward's own call
// scores), else (1 − w)·Reward + w·RoleReward with w the call's agent's role weight; less penalty for
// an invalid call.
func (tr *Trajectory) Score(roleWeight func(agent string) float64, penalty float64, given []float64) {
	for i := range tr.Calls {
		c := &tr.Calls[i]
		if given != nil {
			c.Score = given[i]
		} else {
			w := roleWeight(c.Agent)
			c.Score = (1-w)*tr.Reward + w*c.RoleReward
		}
		if !c.Valid {
			c.Score -= penalty
		}
	}
}
