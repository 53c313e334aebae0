package judge

import (
	"context"
	"fmt"
	"strings"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/metric"
)

// Reward is the outcome reward of a `reward:` section: a Judge or a Remote combined with the
// orchestra's rule checker and the on_error policy. It implements env.OutcomeReward.
type Reward struct {
	cfg    Config
	judge  *Judge
	remote *Remote
}

// New returns the outcome reward of cfg, or nil for type rule (the orchestra's checker stays).
func New(cfg Config) (*Reward, error) {
	cfg = cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Reward{cfg: cfg}
	var err error
	switch cfg.Type {
	case TypeJudge:
		r.judge, err = NewJudge(cfg.Judge)
	case TypeRemote:
		r.remote, err = NewRemote(cfg.Remote)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Wrap puts the outcome reward of cfg under an orchestra (o itself for type rule).
func Wrap(o env.Orchestra, cfg Config) (env.Orchestra, error) {
	r, err := New(cfg)
	if err != nil || r == nil {
		return o, err
	}
	return env.WithOutcomeReward(o, r)
}

// Describe names the reward for logs: "judge http://…/v1/chat/completions (fallback)".
func (r *Reward) Describe() string {
	if r.judge != nil {
		return fmt.Sprintf("judge %s (%s)", r.judge.URL(), r.cfg.Judge.Mode)
	}
	return "remote " + r.remote.URL()
}

// Outcomes scores the rollout's trajectories (env.OutcomeReward).
func (r *Reward) Outcomes(ctx context.Context, roll *env.Rollout, rule env.RuleCheck) ([]env.Outcome, env.RewardStats, error) {
	if r.judge != nil {
		return r.judged(ctx, roll, rule)
	}
	return r.remoted(ctx, roll)
}

// judged asks the judge about every answered trajectory (mode judge) or every one the rule cannot
// decide (mode fallback). A trajectory without an answer scores 0 unasked, as under the rule.
func (r *Reward) judged(ctx context.Context, roll *env.Rollout, rule env.RuleCheck) ([]env.Outcome, env.RewardStats, error) {
	st := env.RewardStats{metric.JudgeCalls: 0, metric.JudgeCacheHits: 0, metric.JudgeFailures: 0, metric.JudgeJudged: 0}
	out := make([]env.Outcome, len(roll.Trajectories))
	var ask []int
	var ins []Input
	for i := range roll.Trajectories {
		tr := &roll.Trajectories[i]
		correct, decided := rule(tr)
		if !tr.Answered || (r.cfg.Judge.Mode == ModeFallback && decided) {
			out[i] = env.Outcome{Reward: b2f(correct && tr.Answered), Success: correct && tr.Answered}
			continue
		}
		task := taskOf(roll, tr)
		ask = append(ask, i)
		ins = append(ins, Input{Question: task.Question, Answer: tr.Answer, References: task.Answers})
	}
	vs := r.judge.Judge(ctx, ins)
	var errs []error
	for k, v := range vs {
		i := ask[k]
		if v.Asked {
			st[metric.JudgeCalls]++
		}
		if v.Cached {
			st[metric.JudgeCacheHits]++
		}
		if v.Err != nil {
			if r.cfg.Judge.OnError != OnErrorScore || ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("trajectory %s: %w", roll.Trajectories[i].TrajUID, v.Err))
				continue
			}
			st[metric.JudgeFailures]++
			out[i] = r.scored(r.cfg.Judge.ErrorScore)
			continue
		}
		st[metric.JudgeJudged]++
		out[i] = r.scored(v.Score)
	}
	if len(errs) > 0 {
		return nil, st, fmt.Errorf("%d of %d judgements failed (reward.judge.on_error: %s); first: %w",
			len(errs), len(vs), r.cfg.Judge.OnError, errs[0])
	}
	return out, st, nil
}

// remoted sends every trajectory to the remote endpoint.
func (r *Reward) remoted(ctx context.Context, roll *env.Rollout) ([]env.Outcome, env.RewardStats, error) {
	st := env.RewardStats{metric.RemoteCalls: 0, metric.RemoteFailures: 0}
	trajs := make([]Trajectory, len(roll.Trajectories))
	for i := range roll.Trajectories {
		trajs[i] = Encode(roll, &roll.Trajectories[i])
	}
	scores, posts := r.remote.Score(ctx, trajs)
	st[metric.RemoteCalls] = float64(posts)
	out := make([]env.Outcome, len(scores))
	var first error
	failed := 0
	for i, s := range scores {
		if s.Err != nil {
			failed++
			if first == nil {
				first = s.Err
			}
			out[i] = r.scored(r.cfg.Remote.ErrorScore)
			continue
		}
		out[i] = r.scored(s.Score)
		out[i].CallScores = s.Calls
	}
	if failed > 0 && (r.cfg.Remote.OnError != OnErrorScore || ctx.Err() != nil) {
		return nil, st, fmt.Errorf("%d of %d trajectories unscored (reward.remote.on_error: %s): %w",
			failed, len(scores), r.cfg.Remote.OnError, first)
	}
	st[metric.RemoteFailures] = float64(failed)
	return out, st, nil
}

func (r *Reward) scored(s float64) env.Outcome {
	return env.Outcome{Reward: s, Success: s >= r.cfg.SuccessThreshold}
}

// Encode turns a trajectory of a rollout into the remote endpoint's JSON form.
func Encode(roll *env.Rollout, tr *env.Trajectory) Trajectory {
	task := taskOf(roll, tr)
	out := Trajectory{ID: tr.TrajUID, Group: tr.UID, TaskID: tr.TaskID, Sample: tr.Sample, Question: task.Question,
		Reference: strings.Join(task.Answers, " | "), References: task.Answers, Answer: tr.Answer, Answered: tr.Answered,
		Calls: make([]Call, len(tr.Calls))}
	if out.References == nil {
		out.References = []string{}
	}
	for i, c := range tr.Calls {
		out.Calls[i] = Call{Agent: c.Agent, Turn: c.Turn, Text: c.Response, Parsed: c.Parsed, Valid: c.Valid}
	}
	return out
}

func taskOf(roll *env.Rollout, tr *env.Trajectory) env.Task {
	if tr.TaskIndex >= 0 && tr.TaskIndex < len(roll.Tasks) {
		return roll.Tasks[tr.TaskIndex]
	}
	return env.Task{ID: tr.TaskID}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var _ env.OutcomeReward = (*Reward)(nil)
