package env

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// dialRule: the Solver answers questions starting with R right and the others wrong; the Helper
// approves, except on questions starting with X, where its verdict is malformed.
func dialRule(r llm.Request) string {
	q := question(r)
	switch {
	case r.Agent == "solver" && q[0] == 'R':
		return `\boxed{4}`
	case r.Agent == "solver":
		return `\boxed{3}`
	case q[0] == 'X':
		return "hmm"
	}
	return "<verify>approve</verify>"
}

func dialConfig(pWrong, pRight float64, calls int) OrchestraConfig {
	c := toyConfig("dial")
	c.Dial = DialConfig{PWrong: pWrong, PRight: pRight, Calls: calls}
	return c
}

// At the far end of the dial the Helper runs exactly `calls` times in every episode the Solver got
// wrong and never in the others; every call carries the team reward (minus the invalid penalty),
// whatever the Helper says.
func TestDialFarEnd(t *testing.T) {
	o := mustOrchestra(t, dialConfig(1, 0, 3), agentsNamed("m", "solver", "helper"), nil)
	s := &script{rule: dialRule}
	r, err := o.Run(context.Background(), s, tasksOf("R1", "W1", "X1"), 2, RunOptions{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(s.batches, " "), "solver×6 helper×4 helper×4 helper×4"; got != want {
		t.Errorf("Generate calls %s, want %s", got, want)
	}
	S, H := "solver", "helper"
	wants := []want{
		{[]string{S}, []bool{true}, []float64{1}, []int{1}, 1},
		{[]string{S, H, H, H}, []bool{true, true, true, true}, []float64{0, 0, 0, 0}, []int{1, 1, 2, 3}, 0},
		{[]string{S, H, H, H}, []bool{true, false, false, false}, []float64{0, -0.1, -0.1, -0.1}, []int{1, 1, 2, 3}, 0},
	}
	for i, tr := range r.Trajectories {
		checkTraj(t, tr, wants[i/2])
	}
	// The Helper's role reward: its verdict matched the truth (approve on a wrong answer does not).
	if c := r.Trajectories[2].Calls[1]; c.RoleReward != 0 {
		t.Errorf("approving a wrong answer earned role reward %g", c.RoleReward)
	}
}

// In between, the Helper's call rate is p_wrong in failing episodes and p_right in the others, drawn
// per episode and call from the run's seed: reruns repeat, another iteration draws anew.
func TestDialRates(t *testing.T) {
	o := mustOrchestra(t, dialConfig(0.8, 0.2, 2), agentsNamed("m", "solver", "helper"), nil)
	var ids []string
	for i := range 100 {
		ids = append(ids, "R"+string(rune('a'+i%26))+string(rune('a'+i/26)), "W"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	tasks := tasksOf(ids...)
	for i := range tasks {
		tasks[i].Question = ids[i] // question() reads characters 1–2 of the toy prompt: keep them unique
	}
	rate := func(r *Rollout) (wrong, right float64) {
		var nw, nr float64
		for _, tr := range r.Trajectories {
			h := float64(len(tr.Calls) - 1)
			if tr.Success {
				right, nr = right+h, nr+2
			} else {
				wrong, nw = wrong+h, nw+2
			}
		}
		return wrong / nw, right / nr
	}
	r1, err := o.Run(context.Background(), &script{rule: dialRule}, tasks, 4, RunOptions{Seed: 1, Iteration: 3})
	if err != nil {
		t.Fatal(err)
	}
	w, rt := rate(r1)
	// 800 chances each: the binomial sd is 0.014; 5 sd.
	if math.Abs(w-0.8) > 0.07 || math.Abs(rt-0.2) > 0.07 {
		t.Errorf("Helper call rates %.3f (wrong) and %.3f (right), want 0.8 and 0.2", w, rt)
	}
	r2, _ := o.Run(context.Background(), &script{rule: dialRule}, tasks, 4, RunOptions{Seed: 1, Iteration: 3})
	r3, _ := o.Run(context.Background(), &script{rule: dialRule}, tasks, 4, RunOptions{Seed: 1, Iteration: 4})
	same, differ := true, false
	for i := range r1.Trajectories {
		same = same && len(r1.Trajectories[i].Calls) == len(r2.Trajectories[i].Calls)
		differ = differ || len(r1.Trajectories[i].Calls) != len(r3.Trajectories[i].Calls)
	}
	if !same || !differ {
		t.Errorf("call pattern: rerun same %v (want true), next iteration differs %v (want true)", same, differ)
	}
}

func TestDialValidate(t *testing.T) {
	for _, c := range []struct {
		dial DialConfig
		key  string
	}{
		{DialConfig{PWrong: 1.5, PRight: 0, Calls: 1}, "orchestra.dial.p_wrong"},
		{DialConfig{PWrong: 1, PRight: -0.1, Calls: 1}, "orchestra.dial.p_right"},
		{DialConfig{PWrong: 1, PRight: math.NaN(), Calls: 1}, "orchestra.dial.p_right"},
		{DialConfig{PWrong: 1, PRight: 0, Calls: 0}, "orchestra.dial.calls"},
	} {
		cfg := dialConfig(0, 0, 1)
		cfg.Dial = c.dial
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%+v: error %v, want one naming %s", c.dial, err, c.key)
		}
	}
	if err := dialConfig(1, 0, 2).Validate(); err != nil {
		t.Errorf("a valid dial: %v", err)
	}
}
