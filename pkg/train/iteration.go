package train

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// item is one agent call turned into a training sequence.
type item struct {
	agent    string
	prompt   []int
	response []int
	adv      float64
	old, ref []float32 // per response token; filled before the updates when needed
}

// batch returns the tasks of an iteration: consecutive slices of a permutation of the training set
// that is redrawn each epoch from (seed, epoch). A pure function of the iteration, so a resumed run
// sees the same tasks.
func (t *Trainer) batch(iteration int) (tasks []env.Task, epoch int) {
	n := len(t.train)
	bs := t.cfg.Algorithm.BatchSize
	start := (iteration - 1) * bs
	for i := 0; i < bs; i++ {
		pos := start + i
		e := pos / n
		perm := rand.New(rand.NewPCG(uint64(t.cfg.Run.Seed), uint64(e))).Perm(n)
		tasks = append(tasks, t.train[perm[pos%n]])
		epoch = e
	}
	return tasks, epoch + 1
}

// iteration runs one training iteration and returns its metrics.
func (t *Trainer) iteration(ctx context.Context, it int) (Metrics, error) {
	m := Metrics{}
	began := time.Now()
	tasks, epoch := t.batch(it)
	m["step"], m["epoch"] = float64(it), float64(epoch)

	roll, err := t.orch.Run(ctx, t.router, tasks, t.cfg.Algorithm.GroupSize, env.RunOptions{Iteration: it, Seed: t.cfg.Run.Seed})
	if err != nil {
		return nil, fmt.Errorf("iteration %d: rollout: %w", it, err)
	}
	m["time/rollout"] = time.Since(began).Seconds()
	if t.cfg.Run.DumpEvery > 0 && it%t.cfg.Run.DumpEvery == 0 {
		if err := t.dumpRollout(it, roll); err != nil {
			return nil, err
		}
	}

	samples := roll.Samples()
	ns := make([]normalize.Sample, len(samples))
	for i, s := range samples {
		ns[i] = normalize.Sample{UID: s.UID, TrajUID: s.TrajUID, Agent: s.Agent, Score: s.Score}
	}
	res, err := normalize.Compute(ns, t.norm)
	if err != nil {
		return nil, fmt.Errorf("iteration %d: advantages: %w", it, err)
	}
	m["reward/mean"] = roll.MeanReward()
	for k, v := range env.AgentMetrics("", roll.AgentStats()) {
		m[k] = v
	}
	for k, v := range roll.Schedule.Metrics() {
		m[k] = v
	}
	m["frac_zero_std"] = res.Stats.FracZeroStd
	m["min_std_applied"] = float64(res.Stats.MinStdApplied)
	for _, a := range res.Stats.Agents {
		p := "adv/agent/" + a.Agent + "/"
		m[p+"mean"], m[p+"std"], m[p+"min"], m[p+"max"] = a.AdvMean, a.AdvStd, a.AdvMin, a.AdvMax
		m["inflation/agent/"+a.Agent] = a.Inflation
	}

	perModel := t.itemsByModel(roll, samples, res.Advantages)
	upd := time.Now()
	tokens := 0
	err = torch.Do(func() error {
		for _, ms := range t.models {
			items := perModel[ms.id]
			for _, x := range items {
				tokens += len(x.prompt) + len(x.response)
			}
			if err := t.update(ms, items, it, m); err != nil {
				return err
			}
		}
		policy.ReleaseMemory() // glibc keeps freed tensor memory otherwise; resident memory creeps up
		return nil
	})
	if err != nil {
		return nil, err
	}
	m["time/update"] = time.Since(upd).Seconds()
	m["time/iteration"] = time.Since(began).Seconds()
	m["perf/tokens_per_s"] = float64(tokens) / math.Max(m["time/update"], 1e-9)
	if rss := torch.ResidentBytes(); rss > 0 {
		m["perf/rss_mb"] = float64(rss) / (1 << 20)
	}
	return m, nil
}

// itemsByModel turns the calls of a rollout into training sequences per model group, with their
// advantages (aligned with samples). Calls without response tokens are skipped.
func (t *Trainer) itemsByModel(roll *env.Rollout, samples []env.Sample, adv []float64) map[string][]*item {
	out := map[string][]*item{}
	for i, s := range samples {
		call := roll.Trajectories[s.Traj].Calls[s.Call]
		if len(call.ResponseIDs) == 0 {
			continue
		}
		model := t.agents[s.Agent].Model
		out[model] = append(out[model], &item{agent: s.Agent, prompt: call.PromptIDs, response: call.ResponseIDs, adv: adv[i]})
	}
	return out
}

// dumpRollout writes an iteration's transcripts to <run>/rollouts/step-N.jsonl (DESIGN.md §7).
func (t *Trainer) dumpRollout(it int, roll *env.Rollout) error {
	dir := filepath.Join(t.dir, "rollouts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b bytes.Buffer
	name := "train"
	if t.cfg.IsToy() {
		name = t.cfg.Toy.Task
	}
	if err := env.WriteTranscripts(&b, name, roll); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, fmt.Sprintf("step-%d.jsonl", it)), b.Bytes())
}
