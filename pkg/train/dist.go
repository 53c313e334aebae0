package train

// Data-parallel training (docs/scale-out.md, README "Data-parallel training"): every rank knows the whole
// batch, rolls out its own share of the tasks (whole prompt groups), and the shares are gathered so
// that every rank holds the global rollout. Advantages, metrics and the split into mini-batches are
// then computed identically everywhere; each rank runs forward/backward on the calls of its own tasks
// only, with the mini-batch's global denominators, and the gradients are summed across ranks before
// the norm. The result equals one process training on the same batch up to float rounding.

import (
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sugarme/gotch/ts"
	"gopkg.in/yaml.v3"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// JoinGroup forms the process group of a launch environment with the config's dist settings. The
// backend "auto" is NCCL when the models run on CUDA, else Gloo. At the rendezvous the ranks compare
// their resolved configs and the drmas version (binary) they run: a difference fails on every rank
// with an error wrapping dist.ErrMismatch that names the keys.
func JoinGroup(cfg *config.Config, e dist.Env, device, binary string) (*dist.Group, error) {
	d := cfg.Dist
	backend := d.Backend
	if backend == "auto" {
		backend = "gloo"
		if usesCUDA(cfg, device) {
			backend = "nccl"
		}
	}
	id, err := configIdentity(cfg)
	if err != nil {
		return nil, err
	}
	id["drmas.version"] = binary
	return dist.Init(e, dist.Options{Backend: backend, Timeout: time.Duration(d.TimeoutS) * time.Second,
		Stall: time.Duration(d.StallS) * time.Second, Identity: id})
}

// configIdentity flattens the resolved config (as --dry-run prints it) into key → value, with the
// keys --set takes (models.0.optim.lr) and the values as YAML writes them.
func configIdentity(cfg *config.Config) (map[string]string, error) {
	b, err := cfg.YAML()
	if err != nil {
		return nil, fmt.Errorf("resolved config: %w", err)
	}
	var tree any
	if err := yaml.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("resolved config: %w", err)
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(joinKey(prefix, k), e)
			}
		case []any:
			for i, e := range x {
				walk(joinKey(prefix, strconv.Itoa(i)), e)
			}
			if len(x) == 0 {
				out[prefix] = "[]"
			}
		default:
			out[prefix] = fmt.Sprint(x)
		}
	}
	walk("", tree)
	return out, nil
}

func joinKey(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// usesCUDA reports whether any model will run on a CUDA device.
func usesCUDA(cfg *config.Config, device string) bool {
	for _, m := range cfg.Models {
		m = cfg.WeightsOf(m)
		d := m.Device
		if d == "" {
			d = device
		}
		if dev, err := torch.ParseDevice(d); err == nil && dev.IsCuda() {
			return true
		}
	}
	return false
}

// shard is the slice [lo, hi) of n tasks that rank r of w rolls out.
func shard(n, r, w int) (lo, hi int) { return r * n / w, (r + 1) * n / w }

// gatherRollout exchanges the ranks' rollouts and returns the global one, as one process would
// have produced it for all tasks: trajectories in task order, task indices global.
func gatherRollout(g *dist.Group, local *env.Rollout, lo int) (*env.Rollout, error) {
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
			cp.Tasks, cp.Trajectories = nil, nil
			out = &cp
		}
		base := len(out.Tasks)
		if base != sh.Offset {
			return nil, fmt.Errorf("rank %d rolled out tasks from %d, expected %d", r, sh.Offset, base)
		}
		out.Tasks = append(out.Tasks, sh.Rollout.Tasks...)
		for _, tr := range sh.Rollout.Trajectories {
			tr.TaskIndex += base
			out.Trajectories = append(out.Trajectories, tr)
		}
	}
	return out, nil
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
			if lo, hi := shard(n, r, w); tr.TaskIndex >= lo && tr.TaskIndex < hi {
				out[i] = r
				break
			}
		}
	}
	return out
}

// syncWeights broadcasts every parameter from rank 0 and checks that all ranks then hold the same
// values (weights start identical; a failed check names the tensor).
func syncWeights(g *dist.Group, names []string, params []*ts.Tensor) error {
	if g.Size() == 1 {
		return nil
	}
	return torch.NoGrad(func() error {
		if err := g.Broadcast(params, 0); err != nil {
			return err
		}
		return g.Verify(names, params)
	})
}

// allReduceGrads sums the parameters' gradients across ranks through one flat buffer.
func allReduceGrads(g *dist.Group, params []*ts.Tensor) error {
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
		if err := g.AllReduce([]*ts.Tensor{buf}, dist.Sum); err != nil {
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
// the tasks, the shares are gathered so every rank holds the global rollout, each rank trains on the
// calls of its own tasks with the mini-batches' global denominators, and the gradients are summed
// over the ranks before the norm.
type dataParallel struct {
	group       *dist.Group
	approxNorms bool // dist.agent_norms: approx (one all-reduce per step, per-agent norms approximated)
}

// rollout plays this rank's shard of the tasks and gathers the ranks' shares.
func (p *dataParallel) rollout(tasks int, play func(lo, hi int) (*env.Rollout, error)) (*env.Rollout, error) {
	lo, hi := shard(tasks, p.group.Rank(), p.group.Size())
	local, err := play(lo, hi)
	if err != nil {
		return nil, err
	}
	roll, err := gatherRollout(p.group, local, lo)
	if err != nil {
		return nil, fmt.Errorf("gathering the ranks' rollouts: %w", err)
	}
	return roll, nil
}

// assign flags the items whose trajectories another rank rolled out.
func (p *dataParallel) assign(perModel map[string][]*item, roll *env.Rollout) {
	owner := ownerOfTrajectory(roll, p.group.Size())
	for _, items := range perModel {
		for _, x := range items {
			x.remote = owner[x.traj] != p.group.Rank()
		}
	}
}

// reduce sums a model's loss terms and token counts over the ranks (each rank's are sums over its own
// calls, already divided by the mini-batches' global denominators).
func (p *dataParallel) reduce(s *modelStats) error {
	v := []float64{s.loss.PG, s.loss.KL, s.loss.Entropy, s.tokens.Tokens, s.tokens.Clipped, s.tokens.ClippedLow, s.tokens.NegLogRatio}
	if err := p.group.AllReduceFloats(v, dist.Sum); err != nil {
		return err
	}
	s.loss = lossTerms{PG: v[0], KL: v[1], Entropy: v[2]}
	s.tokens = tokenCounts{Tokens: v[3], Clipped: v[4], ClippedLow: v[5], NegLogRatio: v[6]}
	return nil
}

// backward is the mini-batch's gradient summed over the ranks. With exact shares (dist.agent_norms:
// exact, and several agents or the guard on: the guard must judge the global share, which every rank
// then sees alike) each agent's share gets an all-reduce of its own (backwardShared); otherwise this
// rank's backward is followed by one all-reduce (completeGrads).
func (p *dataParallel) backward(ms *modelState, mb miniBatch) (stepStats, error) {
	agents, byAgent := groupByAgent(mb.items)
	if !p.approxNorms && (len(agents) > 1 || ms.guard != nil) {
		return p.backwardShared(ms, mb, agents, byAgent, ms.params, func(share *agentShare) error {
			ms.judgeShare(share, nil) // the gradients hold this share alone, summed over the ranks
			return nil
		})
	}
	st, err := ms.backward(mb)
	if err != nil {
		return st, err
	}
	return st, p.completeGrads(ms, &st)
}

// completeGrads makes the gradients global after this rank's backward: the sum over the ranks. The
// per-agent norms become the root of the summed squares of the ranks' own shares (approx); one
// agent's share is the whole (global) gradient.
func (p *dataParallel) completeGrads(ms *modelState, st *stepStats) error {
	if err := allReduceGrads(p.group, ms.params); err != nil {
		return err
	}
	if len(st.agents) == 1 {
		st.agents[0].gradNorm = GradNorm(ms.params)
	}
	if len(st.agents) < 2 {
		return nil
	}
	sq := make([]float64, len(st.agents))
	for i, a := range st.agents {
		sq[i] = a.gradNorm * a.gradNorm
	}
	if err := p.group.AllReduceFloats(sq, dist.Sum); err != nil {
		return err
	}
	for i := range st.agents {
		st.agents[i].gradNorm = math.Sqrt(sq[i])
	}
	return nil
}

// backwardShared is backward across ranks with exact per-agent norms: each agent's share is computed
// alone, summed over the ranks (one all-reduce per agent), measured and judged by the guard (judge:
// the same verdict on every rank, they hold the same sum), and added to the total, which becomes the
// gradient of keep (every parameter; sharded, the owned ones).
func (p *dataParallel) backwardShared(ms *modelState, mb miniBatch, agents []string, byAgent map[string][]*item,
	keep []*ts.Tensor, judge func(*agentShare) error) (stepStats, error) {
	var st stepStats
	var total []*ts.Tensor
	defer func() { dropAll(total) }()
	for _, agent := range agents {
		share := agentShare{agent: agent}
		c := ms.loss.agents[agent]
		xs := localItems(byAgent[agent])
		ZeroGrad(ms.params)
		if err := ms.agentBackward(xs, c, mb, &share, &st); err != nil {
			return st, err
		}
		if err := allReduceGrads(p.group, ms.params); err != nil {
			return st, err
		}
		if err := judge(&share); err != nil {
			return st, err
		}
		st.agents = append(st.agents, share)
		if total == nil {
			total = snapshotGrads(keep)
		} else {
			addGrads(total, keep)
		}
	}
	if total != nil {
		setGrads(keep, total)
	}
	return st, nil
}

// gradNorm is the norm of the reduced gradient every rank holds.
func (p *dataParallel) gradNorm(ms *modelState) (float64, error) { return GradNorm(ms.params), nil }

// step is AdamW on every rank alike: the same gradient, the same state, the same weights after.
func (p *dataParallel) step(ms *modelState) error { return adamwStep(ms.opt)() }

// addGrads adds the parameters' gradients into acc.
func addGrads(acc []*ts.Tensor, params []*ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for i, p := range params {
			acc[i].MustAdd_(p.MustGrad(false))
		}
		return nil
	})
}

// setGrads copies src into the parameters' gradients.
func setGrads(params []*ts.Tensor, src []*ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for i, p := range params {
			p.MustGrad(false).Copy_(src[i])
		}
		return nil
	})
}

// prepareRankDir is prepareDir on rank 0; the other ranks learn from it which checkpoint to resume
// from (they read it from the same folder, which must be on a filesystem every rank sees).
func prepareRankDir(dir string, opt Options) (*runLock, string, error) {
	g := opt.Group
	if g.Size() == 1 {
		return prepareDir(dir, opt)
	}
	step := []float64{-1}
	var ck string
	var lock *runLock
	var err error
	if g.Rank() == 0 {
		if lock, ck, err = prepareDir(dir, opt); err != nil {
			return nil, "", err // the other ranks see rank 0 leave and stop
		}
		if s, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(ck), stepPrefix)); ck != "" && err == nil {
			step[0] = float64(s)
		}
	}
	if err := g.AllReduceFloats(step, dist.Max); err != nil {
		lock.Release()
		return nil, "", err
	}
	if step[0] < 0 {
		return lock, "", nil
	}
	return lock, CheckpointDir(dir, int(step[0])), nil
}

// syncModels broadcasts every model's weights from rank 0 and verifies them (torch thread).
//
// The frozen bases of LoRA adapters too: the warm-up trains them on every rank.
func (t *Trainer) syncModels() error {
	for _, mc := range t.Config.Models {
		if !t.Config.IsFrozenBase(mc.ID) {
			continue
		}
		names, params := policy.SplitParams(t.Router[mc.ID].Model.Parameters())
		if err := syncWeights(t.group, names, params); err != nil {
			return fmt.Errorf("model %s (frozen base): %w", mc.ID, err)
		}
	}
	for _, ms := range t.models {
		if err := syncWeights(t.group, ms.names, ms.params); err != nil {
			return fmt.Errorf("model %s: %w", ms.id, err)
		}
	}
	return nil
}

// stopEverywhere makes the stop decision collective: every rank stops at the same iteration when
// any rank wants to (a signal, run.max_minutes).
func stopEverywhere(g *dist.Group, stop bool) (bool, error) {
	if g.Size() == 1 {
		return stop, nil
	}
	v := []float64{0}
	if stop {
		v[0] = 1
	}
	if err := g.AllReduceFloats(v, dist.Max); err != nil {
		return false, err
	}
	return v[0] > 0, nil
}

// syncEngines brings the serving engines (models[].rollout) to the current weights before a rollout:
// rank 0 writes and loads them, the other ranks wait for it, so no rank samples on stale weights.
func (t *Trainer) syncEngines(ctx context.Context) error {
	if t.group.Rank() == 0 {
		if err := t.ensureSynced(ctx); err != nil {
			return err
		}
	}
	if t.group.Size() > 1 && len(t.engines) > 0 {
		if err := t.group.Barrier(); err != nil {
			return err
		}
		if t.group.Rank() != 0 { // rank 0 loaded each adapter's version under its step's name
			for _, ms := range t.models {
				if c := t.engines[ms.id]; c != nil && ms.cfg.IsAdapter() {
					c.Route(ms.id, t.servedAdapter(ms.id, t.step))
				}
			}
		}
	}
	return nil
}

// RankDevice is the default device of one rank: with CUDA ("auto" finding it, or "cuda"), the GPU of
// its local rank, as torchrun's convention; an explicit cuda:N or cpu stays as it is.
func RankDevice(device string, localRank int) string {
	if device != "" && device != "auto" && device != "cuda" {
		return device
	}
	if d, err := torch.ParseDevice(device); err == nil && d.IsCuda() {
		return fmt.Sprintf("cuda:%d", localRank)
	}
	return device
}
