package train

// Data-parallel training (docs/scale-out.md): every rank knows the whole
// batch, rolls out its own share of the tasks (whole prompt groups), and the shares are gathered so
// that every rank holds the global rollout. Advantages, metrics and the split into mini-batches are
// then computed identically everywhere; each rank runs forward/backward on the calls of its own tasks
// only, with the mini-batch's global denominators, and the gradients are summed across ranks before
// the norm. The result equals one process training on the same batch up to float rounding.

import (
	"bytes"
	"encoding/gob"
	"fmt"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/plan"
	"github.com/drmas/drmas/pkg/shard"
	"github.com/drmas/drmas/pkg/torch"
)

// taskShare is the slice [lo, hi) of n tasks that rank r of w rolls out.
func taskShare(n, r, w int) (lo, hi int) { return r * n / w, (r + 1) * n / w }

// gatherRollout exchanges the ranks' rollouts and returns the global one, as one process would
// have produced it for all tasks: trajectories in task order, task indices global.
func gatherRollout(g *c10d.Group, local *env.Rollout, lo int) (*env.Rollout, error) {
	if g.Size() == 1 {
		return local, nil
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(rolloutShare{Offset: lo, Rollout: local}); err != nil {
		return nil, fmt.Errorf("encode rollout: %w", err)
	}
	parts, err := g.AllGatherBytes(buf.Bytes())
	if err != nil {
		return nil, err
	}
	var out *env.Rollout
	for r, p := range parts {
		var sh rolloutShare
		if err := gob.NewDecoder(bytes.NewReader(p)).Decode(&sh); err != nil {
			return nil, fmt.Errorf("decode rank %d's rollout: %w", r, err)
		}
		if sh.Rollout == nil {
			continue
		}
		if out == nil {
			cp := *sh.Rollout
			cp.Tasks, cp.Trajectories, cp.RewardStats = nil, nil, nil
			out = &cp
		}
		if base := len(out.Tasks); base != sh.Offset {
			return nil, fmt.Errorf("rank %d rolled out tasks from %d, expected %d", r, sh.Offset, base)
		}
		appendRollout(out, sh.Rollout)
	}
	return out, nil
}

// appendRollout adds more's tasks and trajectories after out's (task indices shifted) and sums their
// judge / remote reward counts.
func appendRollout(out, more *env.Rollout) {
	base := len(out.Tasks)
	out.Tasks = append(out.Tasks, more.Tasks...)
	for _, tr := range more.Trajectories {
		tr.TaskIndex += base
		out.Trajectories = append(out.Trajectories, tr)
	}
	if more.RewardStats != nil {
		out.RewardStats = out.RewardStats.Add(more.RewardStats)
	}
}

// rolloutShare is what each rank sends: its rollout and the index of its first task.
type rolloutShare struct {
	Offset  int
	Rollout *env.Rollout
}

// ownerOfTrajectory maps the global rollout's trajectories to the ranks that rolled them out.
func ownerOfTrajectory(roll *env.Rollout, w int) []int {
	n := len(roll.Tasks)
	out := make([]int, len(roll.Trajectories))
	for i, tr := range roll.Trajectories {
		for r := 0; r < w; r++ {
			if lo, hi := taskShare(n, r, w); tr.TaskIndex >= lo && tr.TaskIndex < hi {
				out[i] = r
				break
			}
		}
	}
	return out
}

// tokenShares assigns the global rollout's trajectories to w ranks in shares of (nearly) equal
// token count: whole trajectories, by the prompt and response tokens of their trained calls (those
// with a response), longest first (ties: the earlier trajectory), each to the rank with the fewest
// tokens so far (ties: the lower rank). A function of the global rollout, so every rank computes the
// same shares and the gradients summed over the ranks are those of one process.
func tokenShares(roll *env.Rollout, w int) []int {
	sizes := make([]int64, len(roll.Trajectories))
	for i, tr := range roll.Trajectories {
		for _, c := range tr.Calls {
			if len(c.ResponseIDs) > 0 {
				sizes[i] += int64(len(c.PromptIDs) + len(c.ResponseIDs))
			}
		}
	}
	owner, _ := plan.Balance(sizes, w)
	return owner
}

// allReduceGrads sums the parameters' gradients across ranks through one flat buffer.
func allReduceGrads(g *c10d.Group, params []*ts.Tensor) error {
	if g.Size() == 1 {
		return nil
	}
	s := torch.NewScope()
	defer s.Close()
	return torch.NoGrad(func() error {
		grads := make([]*ts.Tensor, len(params))
		flat := make([]*ts.Tensor, len(params))
		for i, p := range params {
			grads[i] = p.MustGrad(false)
			if !grads[i].MustDefined() {
				return fmt.Errorf("dist: parameter %d has no gradient to all-reduce", i)
			}
			flat[i] = grads[i].MustView([]int64{-1}, false)
		}
		buf := ts.MustCat(flat, 0)
		if err := g.AllReduce([]*ts.Tensor{buf}, c10d.Sum); err != nil {
			return err
		}
		off := int64(0)
		for _, gr := range grads {
			n := gr.Numel()
			part := buf.MustNarrow(0, off, int64(n), false).MustView(gr.MustSize(), true)
			gr.Copy_(part)
			off += int64(n)
		}
		return nil
	})
}

// dataParallel is the parallel strategy over a c10d group: each rank plays its contiguous share of
// the tasks, the shares are gathered so every rank holds the global rollout, each rank trains on its
// share of the trajectories (dist.balance: of equal token count, or those of its own tasks) with the
// mini-batches' global denominators, and the gradients are summed over the ranks before the norm.
type dataParallel struct {
	wholeWeights
	g           *c10d.Group
	approxNorms bool // dist.agent_norms: approx (one all-reduce per step, per-agent norms approximated)
	byTokens    bool // dist.balance: tokens (else tasks)
}

func (p *dataParallel) share(tasks int) (int, int) { return taskShare(tasks, p.g.Rank(), p.g.Size()) }

// gather exchanges the ranks' rollouts (gatherRollout).
func (p *dataParallel) gather(local *env.Rollout, lo int) (*env.Rollout, error) {
	roll, err := gatherRollout(p.g, local, lo)
	if err != nil {
		return nil, fmt.Errorf("gathering the ranks' rollouts: %w", err)
	}
	return roll, nil
}

// trainsOn marks the trajectories this rank trains on: under dist.balance: tokens its share of
// equal token count (tokenShares), else those it rolled out.
func (p *dataParallel) trainsOn(roll *env.Rollout) []bool {
	var owner []int
	if p.byTokens {
		owner = tokenShares(roll, p.g.Size())
	} else {
		owner = ownerOfTrajectory(roll, p.g.Size())
	}
	out := make([]bool, len(owner))
	for i, r := range owner {
		out[i] = r == p.g.Rank()
	}
	return out
}

func (p *dataParallel) exactShares() bool { return !p.approxNorms }

func (p *dataParallel) grads(_ string, params []*ts.Tensor) ([]*ts.Tensor, func()) {
	return params, func() {}
}

func (p *dataParallel) reduce(_ string, params []*ts.Tensor) error {
	return allReduceGrads(p.g, params)
}

// norm is the norm of the reduced gradient every rank holds.
func (p *dataParallel) norm(_ string, kept []*ts.Tensor) (float64, error) { return GradNorm(kept), nil }

func (p *dataParallel) sum(v []float64) error { return p.g.AllReduceFloats(v, c10d.Sum) }

func (p *dataParallel) max(v []float64) error { return p.g.AllReduceFloats(v, c10d.Max) }

// step is AdamW on every rank alike: the same gradient, the same state, the same weights after.
func (p *dataParallel) step(_ string, opt *optim.AdamW, _ []*ts.Tensor) error {
	return adamwStep(opt)()
}

func (p *dataParallel) partition(string) *shard.Partition { return nil }

func (p *dataParallel) group() *c10d.Group { return p.g }
