// Package rollout gives each training iteration its rollout: a Source asks a Player (the team, on
// the engines) for an iteration's episodes, now (sync.go) or ahead of training (ahead.go:
// rollout.max_staleness), and checks that no sample is older than the weights it may train.
//
// The training step knows only Next (the rollout iteration it trains on) and Updated (its update is
// done); what runs ahead, what waits and what a checkpoint keeps is the source's. A new source is
// one file implementing Source plus one line in sources.
package rollout

import (
	"context"
	"errors"
	"fmt"

	"github.com/drmas/drmas/pkg/env"
)

// PendingFile holds, in a checkpoint, the rollouts generated ahead of training.
const PendingFile = "pending-rollouts.gob"

// ErrStaleSample is wrapped by the error of an iteration whose rollout, or one of its calls, is older
// than rollout.max_staleness versions.
var ErrStaleSample = errors.New("rollout older than rollout.max_staleness")

// Share is one rank's share of an iteration's rollout: the episodes of its tasks from task Lo (the
// whole batch in one process), with the epoch the batch's tasks belong to.
type Share struct {
	It, Epoch, Lo int
	Roll          *env.Rollout
}

// Player plays an iteration's episodes on the weights the engines serve now.
type Player interface {
	// Play runs this rank's share of iteration it's tasks; shown says whether the run's progress
	// follows it (a rollout generated ahead runs unseen beside the update).
	Play(ctx context.Context, it int, shown bool) (Share, error)
	// Complete makes a share the iteration's whole rollout: the ranks' shares gathered (a collective:
	// every rank calls it at the same point of the schedule) and any extra draws it needs.
	Complete(ctx context.Context, s Share) (*env.Rollout, error)
}

// Source gives each iteration its rollout.
type Source interface {
	// Next returns the rollout iteration it trains on (its Version: the weights version that
	// generated it) and its tasks' epoch, version being the weights the engines serve now.
	Next(ctx context.Context, it, version int) (*env.Rollout, int, error)
	// Updated says iteration it's update is done: what the source still generates is settled
	// before the engines take the new weights. It adds what it measured to the iteration's metrics.
	Updated(ctx context.Context, it int, m map[string]float64) error
	// Pending encodes what a checkpoint keeps (nil: nothing).
	Pending() ([]byte, error)
	// Close cancels and waits for any generation in flight.
	Close()
}

// Options are what a source is built with besides its player.
type Options struct {
	// Solo: one process (the ranks of a data-parallel group settle their shares collectively).
	Solo bool
	// Reload runs after an update while a rollout generated ahead still runs (running closes when it
	// ends): the engines taking the new weights in turn. nil: nothing.
	Reload func(ctx context.Context, step int, running <-chan struct{})
	// Resume is the checkpoint folder the run resumes from ("" for a fresh run), at step Step.
	Resume string
	Step   int
}

// sources builds each source by name (Config.source chooses).
var sources = map[string]func(Config, Player, Options) (Source, error){
	"sync":  openSync,
	"ahead": openAhead,
}

// Open builds the source the section asks for.
func Open(c Config, p Player, o Options) (Source, error) {
	open, ok := sources[c.source()]
	if !ok {
		return nil, fmt.Errorf("rollout: no source %q", c.source())
	}
	return open(c, p, o)
}

// staleCalls checks every call of a rollout against the version its engine says sampled it: none
// may be more than k versions before step, the weights iteration it trains. Calls sampled
// in-process, or whose engine names no version, are judged by the rollout's version alone.
func staleCalls(roll *env.Rollout, it, step, k int) error {
	for _, tr := range roll.Trajectories {
		for _, c := range tr.Calls {
			if v := c.Version; v.Known && step-v.Step > k {
				return fmt.Errorf("%w: iteration %d: agent %s's call was sampled by weights version %q (replica %s), %d versions before %d (K = %d)",
					ErrStaleSample, it, c.Agent, v, c.Replica, step-v.Step, step, k)
			}
		}
	}
	return nil
}
