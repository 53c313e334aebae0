package train

import (
	"context"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/rollout"
)

// playShare runs group_size episodes of each task of draw d's tasks (d = 0: the iteration's batch;
// d ≥ 1: algorithm.filter_groups' extra draws) that the parallel strategy gives this rank: a
// contiguous share of whole prompt groups, with the task offset that keeps their group ids those of
// the whole draw. It is the one place episodes are played; it returns the share and its first task.
func (t *Team) playShare(ctx context.Context, gen llm.Generator, tasks []env.Task, it, d int, par parallel, progress func(done, total int)) (*env.Rollout, int, error) {
	lo, hi := par.share(len(tasks))
	seed := t.plan.seed
	if d > 0 {
		seed ^= int64(d) * 0x5bd1e995
	}
	roll, err := t.Orchestra.Run(ctx, gen, tasks[lo:hi], t.plan.groupSize,
		env.RunOptions{Iteration: it, Seed: seed, TaskOffset: d*t.plan.batchSize + lo, Progress: progress})
	return roll, lo, err
}

// rollout plays iteration it's whole rollout through gen in one process (filter_groups' extra draws
// included): what `drmas inspect-grads` rolls out.
func (t *Team) rollout(ctx context.Context, gen llm.Generator, it int) (*env.Rollout, int, error) {
	defer t.Router.HoldDecodingLayout()() // the weights are fixed: pack them once
	tasks, epoch := t.batch(it)
	roll, _, err := t.playShare(ctx, gen, tasks, it, 0, single{}, nil)
	if err != nil {
		return nil, epoch, err
	}
	roll, err = t.fillGroups(ctx, gen, it, roll, single{})
	return roll, epoch, err
}

// player plays the trainer's iterations on its engines (rollout.Player): each rank its share of the
// batch's tasks, gathered into the whole rollout; filter_groups' extra draws where they need no
// other rank (one process: while playing) or once the shares are gathered.
type player struct{ t *Trainer }

// Play runs this rank's share of iteration it's tasks; shown: the bar follows it (a rollout
// generated ahead runs unseen, beside the update).
func (p player) Play(ctx context.Context, it int, shown bool) (rollout.Share, error) {
	t := p.t
	gen := t.engines.Generator()
	var progress func(done, total int)
	if shown {
		defer t.Router.HoldDecodingLayout()() // nothing trains meanwhile: pack the weights once
		gen, progress = t.report.Generator(gen, it), t.report.Trajectories()
	}
	tasks, epoch := t.batch(it)
	roll, lo, err := t.playShare(ctx, gen, tasks, it, 0, t.par, progress)
	if err == nil && t.par.group().Size() == 1 {
		roll, err = t.fillGroups(ctx, gen, it, roll, t.par)
	}
	return rollout.Share{It: it, Epoch: epoch, Lo: lo, Roll: roll}, err
}

// Complete gathers the ranks' shares into the whole rollout (every rank calls it at the same point)
// and, data-parallel, rolls out filter_groups' extra draws.
func (p player) Complete(ctx context.Context, s rollout.Share) (*env.Rollout, error) {
	t := p.t
	roll, err := t.par.gather(s.Roll, s.Lo)
	if err != nil || t.par.group().Size() == 1 || t.plan.draws <= 0 {
		return roll, err
	}
	defer t.Router.HoldDecodingLayout()()
	return t.fillGroups(ctx, t.engines.Generator(), s.It, roll, t.par)
}
