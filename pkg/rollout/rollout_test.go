package rollout

import (
	"context"
	"errors"
	"testing"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
)

// fakePlayer plays each iteration into a rollout of its own, counting the plays (a rollout of
// iteration j carries Iteration j).
type fakePlayer struct{ plays []int }

func (p *fakePlayer) Play(_ context.Context, it int, _ bool) (Share, error) {
	p.plays = append(p.plays, it)
	return Share{It: it, Epoch: 1, Roll: &env.Rollout{Iteration: it}}, nil
}

func (p *fakePlayer) Complete(_ context.Context, s Share) (*env.Rollout, error) { return s.Roll, nil }

// A rollout generated more than rollout.max_staleness versions before the weights it would train is
// refused (ErrStaleSample); one within the bound is trained on and leaves the source when its
// iteration is done.
func TestStaleRolloutRefused(t *testing.T) {
	for _, c := range []struct {
		k, version int
		stale      bool
	}{{1, 4, false}, {1, 3, true}, {2, 3, false}, {2, 2, true}} {
		roll := &env.Rollout{Version: c.version}
		src, _ := openAhead(Config{MaxStaleness: c.k}, &fakePlayer{}, Options{Solo: true})
		s := src.(*aheadSource)
		for j := 6; j < 6+c.k; j++ {
			s.ready[j] = &ahead{It: j, Version: c.version, Roll: roll}
		}
		got, _, err := s.Next(context.Background(), 6, 5)
		if c.stale != errors.Is(err, ErrStaleSample) || (!c.stale && got != roll) {
			t.Errorf("K %d, version %d at step 5: rollout %v, err %v; want stale %v", c.k, c.version, got, err, c.stale)
		}
		if !c.stale {
			m := map[string]float64{}
			if err := s.Updated(context.Background(), 6, m); err != nil || s.ready[6] != nil {
				t.Errorf("K %d: after the update: err %v, iteration 6's rollout still held: %v", c.k, err, s.ready[6] != nil)
			}
			if m["rollout/staleness"] != float64(5-c.version) {
				t.Errorf("K %d: staleness %v, want %d", c.k, m["rollout/staleness"], 5-c.version)
			}
		}
		s.Close()
	}
}

// The schedule: with K ahead, iteration j's rollout comes from the weights the engines served when
// iteration j−K started (version max(0, j−1−K)): the first K are played before iteration 1, then
// each iteration starts the one K later.
func TestAheadSchedule(t *testing.T) {
	p := &fakePlayer{}
	src, _ := Open(Config{MaxStaleness: 2}, p, Options{Solo: true})
	defer src.Close()
	for it := 1; it <= 4; it++ {
		roll, _, err := src.Next(context.Background(), it, it-1)
		if err != nil {
			t.Fatal(err)
		}
		if want := max(0, it-1-2); roll.Iteration != it || roll.Version != want {
			t.Fatalf("iteration %d: rollout of iteration %d by version %d, want version %d", it, roll.Iteration, roll.Version, want)
		}
		if err := src.Updated(context.Background(), it, map[string]float64{}); err != nil {
			t.Fatal(err)
		}
	}
	if want := []int{1, 2, 3, 4, 5, 6}; len(p.plays) != len(want) {
		t.Fatalf("played %v, want %v", p.plays, want)
	}
}

// A call whose engine says an older weights version sampled it than the bound allows is refused, even
// when its rollout's version is within the bound (a replica that missed a reload); calls sampled
// in-process or with no version are judged by the rollout's version.
func TestStaleCallRefused(t *testing.T) {
	adapter := func(step int) llm.Version { return llm.Version{Step: step, Adapter: "solver@x.a1b2c3d4", Known: true} }
	for _, c := range []struct {
		version llm.Version
		k       int
		stale   bool
	}{{llm.StepVersion(4), 1, false}, {llm.StepVersion(3), 1, true}, {llm.StepVersion(3), 2, false}, {llm.StepVersion(5), 0, false},
		{llm.StepVersion(4), 0, true}, {adapter(4), 1, false}, {adapter(3), 1, true}, {llm.Version{}, 0, false},
		{llm.Version{Adapter: "custom"}, 0, false}} {
		roll := &env.Rollout{Trajectories: []env.Trajectory{{Calls: []env.Call{{Agent: "solver", Version: llm.StepVersion(5)}, {Agent: "solver", Version: c.version}}}}}
		err := staleCalls(roll, 6, 5, c.k)
		if c.stale != errors.Is(err, ErrStaleSample) {
			t.Errorf("call version %+v, K %d at step 5: err %v; want stale %v", c.version, c.k, err, c.stale)
		}
	}
}
