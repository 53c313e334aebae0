package env

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
)

// fakeReward gives trajectory i the reward rewards[i] (and calls[i] as call scores when set) and
// records what the rule said of each trajectory.
type fakeReward struct {
	rewards []float64
	calls   map[int][]float64
	err     error
	rule    [][2]bool
}

func (f *fakeReward) Outcomes(_ context.Context, r *Rollout, rule RuleCheck) ([]Outcome, RewardStats, error) {
	if f.err != nil {
		return nil, RewardStats{}, f.err
	}
	out := make([]Outcome, len(r.Trajectories))
	for i := range r.Trajectories {
		c, d := rule(&r.Trajectories[i])
		f.rule = append(f.rule, [2]bool{c, d})
		out[i] = Outcome{Reward: f.rewards[i%len(f.rewards)], Success: f.rewards[i%len(f.rewards)] >= 1, CallScores: f.calls[i]}
	}
	return out, RewardStats{"reward/judge/calls": float64(len(out)), "reward/judge/judged": float64(len(out))}, nil
}

// An outcome reward replaces the team reward of every trajectory, and every call's score is
// recomputed from it with the agent's role weight and the invalid-action penalty (or is the given
// per-call score less the penalty); the rule the reward sees is the orchestra's checker.
func TestOutcomeRewardRescores(t *testing.T) {
	agents := agentsNamed("m", "solver", "verifier")
	agents[0].Reward.RoleWeight = 0.5
	inner := mustOrchestra(t, toyConfig("math"), agents, nil)
	fake := &fakeReward{rewards: []float64{0.25, 0.75, 1, 0}, calls: map[int][]float64{1: {0.5, 0.125, 2}}}
	o, err := WithOutcomeReward(inner, fake)
	if err != nil {
		t.Fatal(err)
	}
	// T0 right, T2 reject then right (3 calls), T1 wrong, T5 invalid solution (no answer).
	r, err := o.Run(context.Background(), &script{rule: mathRule}, tasksOf("T0", "T2", "T1", "T5"), 1, RunOptions{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := [][2]bool{{true, true}, {true, true}, {false, true}, {false, true}}; !slices.Equal(fake.rule, want) {
		t.Errorf("rule %v, want %v", fake.rule, want)
	}
	wants := [][]float64{
		{0.5*0.25 + 0.5*1, 0.25}, // solver: half reward, half its own answer's role reward (right)
		{0.5, 0.125, 2},          // the given call scores
		{0.5*1 + 0.5*0, 1},       // wrong answer: role reward 0
		{0.5*0 + 0.5*0 - 0.1, 0}, // invalid solution: the penalty
	}
	for i, tr := range r.Trajectories {
		if tr.Reward != fake.rewards[i] || tr.Success != (fake.rewards[i] >= 1) {
			t.Errorf("trajectory %d: reward %g success %v, want %g", i, tr.Reward, tr.Success, fake.rewards[i])
		}
		var got []float64
		for _, c := range tr.Calls {
			got = append(got, c.Score)
		}
		if !slices.EqualFunc(got, wants[i], approx) {
			t.Errorf("trajectory %d: scores %v, want %v", i, got, wants[i])
		}
	}
	if r.RewardStats["reward/judge/calls"] != 4 || r.RewardStats["reward/judge/judged"] != 4 {
		t.Errorf("reward stats %+v", r.RewardStats)
	}
	if RuleOrchestra(o) != inner || RuleOrchestra(inner) != inner {
		t.Error("RuleOrchestra does not unwrap")
	}
	if err := CheckPrompts(o); err != nil {
		t.Error(err)
	}
	if ops, err := Openings(o, tasksOf("T0")[0]); err != nil || len(ops) != 1 {
		t.Errorf("openings of the wrapped orchestra: %v, %v", ops, err)
	}

	fake.err = errors.New("judge http://x: timeout")
	if _, err := o.Run(context.Background(), &script{rule: mathRule}, tasksOf("T0"), 1, RunOptions{}); err == nil || !strings.Contains(err.Error(), "reward: judge http://x: timeout") {
		t.Errorf("a failing reward: %v", err)
	}
	fake.err, fake.calls = nil, map[int][]float64{0: {1}} // one score for two calls
	if _, err := o.Run(context.Background(), &script{rule: mathRule}, tasksOf("T0"), 1, RunOptions{}); err == nil || !strings.Contains(err.Error(), "1 call scores for 2 calls") {
		t.Errorf("call scores of the wrong length: %v", err)
	}
}

// The rule a search team's reward sees is exact match, which never decides a mismatch.
func TestOutcomeRuleQA(t *testing.T) {
	tm := &team{typ: "search"}
	r := &Rollout{Tasks: []Task{{Answers: []string{"Paris"}}}}
	for _, c := range []struct {
		answer           string
		answered         bool
		correct, decided bool
	}{{"paris", true, true, true}, {"the city of Paris", true, false, false}, {"", false, false, true}} {
		got, dec := tm.rule(r, &Trajectory{Answer: c.answer, Answered: c.answered})
		if got != c.correct || dec != c.decided {
			t.Errorf("%q: correct %v decided %v, want %v %v", c.answer, got, dec, c.correct, c.decided)
		}
	}
}

// The ranks' counts add up field by field, the type kept.
func TestRewardStatsAdd(t *testing.T) {
	a := RewardStats{"a": 1, "b": 2, "c": 3}
	b := RewardStats{"a": 10, "b": 20, "d": 40}
	want := RewardStats{"a": 11, "b": 22, "c": 3, "d": 40}
	if got := b.Add(a); !maps.Equal(got, want) {
		t.Errorf("%+v, want %+v", got, want)
	}
}
