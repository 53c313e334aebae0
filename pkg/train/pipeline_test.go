package train

import (
	"context"
	"errors"
	"testing"

	"github.com/drmas/drmas/pkg/env"
)

// A rollout generated more than rollout.max_staleness versions before the weights it would train is
// refused (ErrStaleSample); one within the bound is trained on and leaves the pipeline.
func TestStaleRolloutRefused(t *testing.T) {
	for _, c := range []struct {
		k, version int
		stale      bool
	}{{1, 4, false}, {1, 3, true}, {2, 3, false}, {2, 2, true}} {
		roll := &env.Rollout{Version: c.version}
		tr := &Trainer{step: 5, pipe: newPipeline(c.k, func(_ context.Context, j int) *ahead { return &ahead{It: j, done: make(chan struct{})} },
			func(*ahead) error { return nil }, true)}
		for j := 6; j < 6+c.k; j++ {
			tr.pipe.ready[j] = &ahead{It: j, Version: c.version, Roll: roll}
		}
		got, _, err := tr.rollout(context.Background(), 6, nil)
		if c.stale != errors.Is(err, ErrStaleSample) || (!c.stale && got != roll) {
			t.Errorf("K %d, version %d at step 5: rollout %v, err %v; want stale %v", c.k, c.version, got, err, c.stale)
		}
	}
}

// A call whose engine says an older weights version sampled it than the bound allows is refused, even
// when its rollout's version is within the bound (a replica that missed a reload); calls sampled
// in-process or with no version are judged by the rollout's version.
func TestStaleCallRefused(t *testing.T) {
	for _, c := range []struct {
		version string
		k       int
		stale   bool
	}{{"v4", 1, false}, {"v3", 1, true}, {"v3", 2, false}, {"v5", 0, false}, {"v4", 0, true},
		{"solver@4.a1b2c3d4", 1, false}, {"solver@3.a1b2c3d4", 1, true}, {"", 0, false}, {"custom", 0, false}} {
		roll := &env.Rollout{Trajectories: []env.Trajectory{{Calls: []env.Call{{Agent: "solver", Version: "v5"}, {Agent: "solver", Version: c.version}}}}}
		err := staleCalls(roll, 6, 5, c.k)
		if c.stale != errors.Is(err, ErrStaleSample) {
			t.Errorf("call version %q, K %d at step 5: err %v; want stale %v", c.version, c.k, err, c.stale)
		}
	}
}
