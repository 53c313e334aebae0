package train

// DAPO's dynamic sampling (algorithm.filter_groups): a prompt group whose calls all score alike gives
// every call a zero advantage under any estimator, so it costs an update and teaches nothing. Such
// groups are dropped and more tasks rolled out, batch by batch, until batch_size groups have signal
// or max_draws batches were rolled out; a batch still short trains on the groups it has (all of the
// first batch's when none had signal). The extra batches are a pure function of (seed, iteration,
// draw), so a resumed run draws the same ones.

import (
	"context"
	"math/rand/v2"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
)

// fillGroups applies algorithm.filter_groups to iteration it's rollout (the whole batch, gathered):
// off, it returns roll as it is. Each rank plays its share of every extra batch (par).
func (t *Team) fillGroups(ctx context.Context, gen llm.Generator, it int, roll *env.Rollout, par parallel) (*env.Rollout, error) {
	draws := t.plan.draws
	if draws <= 0 {
		return roll, nil
	}
	bs := t.plan.batchSize
	f := &env.GroupFilter{Draws: 1}
	out := keepGroups(roll, bs, f)
	for d := 1; d < draws && len(out.Tasks) < bs; d++ {
		local, lo, err := t.playShare(ctx, gen, t.extraBatch(it, d), it, d, par, nil)
		if err != nil {
			return nil, err
		}
		extra, err := par.gather(local, lo)
		if err != nil {
			return nil, err
		}
		f.Draws++
		appendRollout(out, keepGroups(extra, bs-len(out.Tasks), f))
	}
	if len(out.Tasks) == 0 { // nothing had signal: the first batch, as it is
		out = roll
	}
	f.Groups = len(out.Tasks)
	out.Filter = f
	return out, nil
}

// extraBatch is draw d's batch of tasks for iteration it: batch_size tasks of a permutation of the
// training set drawn from (seed, it, d), apart from the epochs' permutations.
func (t *Team) extraBatch(it, d int) []env.Task {
	n := len(t.Train)
	perm := rand.New(rand.NewPCG(uint64(t.plan.seed)^0xd4a0f11e, uint64(it)<<8|uint64(d))).Perm(n)
	tasks := make([]env.Task, t.plan.batchSize)
	for i := range tasks {
		tasks[i] = t.Train[perm[i%n]]
	}
	return tasks
}

// keepGroups returns a rollout of roll's first max groups with signal (some call scoring otherwise
// than another), counting the others in f.Dropped.
func keepGroups(roll *env.Rollout, max int, f *env.GroupFilter) *env.Rollout {
	out := *roll
	out.Tasks, out.Trajectories = nil, nil
	byTask := make([][]env.Trajectory, len(roll.Tasks))
	for _, tr := range roll.Trajectories {
		byTask[tr.TaskIndex] = append(byTask[tr.TaskIndex], tr)
	}
	for i, trs := range byTask {
		if !hasSignal(trs) {
			f.Dropped++
			continue
		}
		if len(out.Tasks) == max {
			continue
		}
		for _, tr := range trs {
			tr.TaskIndex = len(out.Tasks)
			out.Trajectories = append(out.Trajectories, tr)
		}
		out.Tasks = append(out.Tasks, roll.Tasks[i])
	}
	return &out
}

// hasSignal says whether a group's calls do not all carry the same score.
func hasSignal(trs []env.Trajectory) bool {
	first, seen := 0.0, false
	for _, tr := range trs {
		for _, c := range tr.Calls {
			if !seen {
				first, seen = c.Score, true
			} else if c.Score != first {
				return true
			}
		}
	}
	return false
}
