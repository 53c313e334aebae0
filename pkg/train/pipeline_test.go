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
		got, _, err := tr.rollout(context.Background(), 6)
		if c.stale != errors.Is(err, ErrStaleSample) || (!c.stale && got != roll) {
			t.Errorf("K %d, version %d at step 5: rollout %v, err %v; want stale %v", c.k, c.version, got, err, c.stale)
		}
	}
}
