// Package gateway trains a multi-agent system written outside drmas: the gateway orchestra
// (orchestra.type: gateway) hands each episode to the user's runner (POST <runner.url>/run, runner.go)
// with an OpenAI-compatible endpoint of its own (server.go); the runner's unchanged agent code calls
// it with each agent's name as the model, and every call is sampled with that agent's model and
// settings and recorded with its exact prompt ids, sampled ids and log-probs — one sample of its
// agent, trained on as the built-in orchestras' calls are (never a re-tokenization of the text the
// runner sends back). The runner answers with the episode's reward (and optional role rewards).
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/toolcall"
)

// Type is the gateway orchestra's name (orchestra.type: gateway).
var Type = env.Register("gateway", env.External{Build: build, Penalty: 0.1, Retrieval: env.NoRetrieval})

// Gateway is the gateway orchestra. Its endpoint and the runner start with its first Run and stop
// with Close.
type Gateway struct {
	cfg     Config
	names   []string // agents in config order
	agents  map[string]*agentSpec
	penalty float64

	once   sync.Once
	err    error
	srv    *server
	runner *runner
}

// build makes the gateway orchestra of a config: section is its runner section.
func build(_ env.OrchestraConfig, agents []env.AgentConfig, section any, penalty float64) (env.Orchestra, error) {
	cfg, ok := section.(Config)
	if p, isPtr := section.(*Config); isPtr && p != nil {
		cfg, ok = *p, true
	}
	if !ok {
		return nil, errors.New("orchestra.runner: required by the gateway orchestra (url of the runner that plays the episodes)")
	}
	if err := cfg.Validate("orchestra.runner"); err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg.withDefaults(), agents: map[string]*agentSpec{}, penalty: penalty}
	for _, a := range agents {
		spec := &agentSpec{name: a.Name, model: a.Model, sampling0: a.Sampling.Resolve(), kwargs: a.ChatTemplateKwargs, roleWeight: a.Reward.RoleWeight, maxPrompt: a.MaxPromptTokens}
		if f, err := toolcall.FormatFor(a.ToolFormat); err == nil && a.ToolFormat != "" {
			spec.format = f
		}
		g.names = append(g.names, a.Name)
		g.agents[a.Name] = spec
	}
	return g, nil
}

// Agents lists the agent names in config order.
func (g *Gateway) Agents() []string { return append([]string(nil), g.names...) }

// Schedule is zero: the runner owns whatever curriculum its episodes follow.
func (g *Gateway) Schedule(int) env.Schedule { return env.Schedule{} }

// start brings up the endpoint and the runner, once.
func (g *Gateway) start(ctx context.Context) error {
	g.once.Do(func() {
		if g.srv, g.err = newServer(g.agents); g.err != nil {
			return
		}
		g.runner = newRunner(g.cfg)
		g.err = g.runner.start(ctx)
	})
	return g.err
}

// Close stops the runner drmas started and the endpoint.
func (g *Gateway) Close() error {
	if g.runner != nil {
		g.runner.stop()
	}
	if g.srv != nil {
		g.srv.close()
	}
	return nil
}

// Metric keys of the gateway's counters (a rollout's RewardStats, written as they are; pkg/metric).
const (
	MetricFailed   = metric.GatewayFailed // episodes that failed every attempt: left out
	MetricRetried  = metric.GatewayRetried
	MetricGenShare = metric.GatewayGenShare // of the episodes' wall time, the part their calls waited for completions
)

// Run hands n episodes of every task to the runner, runner.concurrency at a time, and returns their
// trajectories: each episode's calls in arrival order, scored with the reward the runner gave
// (score = (1 − w)·reward + w·agent_reward − penalty·[invalid]). An episode that fails every attempt
// is left out of the rollout, counted (rollout/gateway/failed_episodes) and logged, never scored 0;
// a runner no attempt reaches stops the run, naming its URL.
func (g *Gateway) Run(ctx context.Context, gen llm.Generator, tasks []env.Task, n int, opts env.RunOptions) (*env.Rollout, error) {
	if len(tasks) == 0 || n < 1 {
		return nil, fmt.Errorf("gateway: %d tasks × %d samples: nothing to run", len(tasks), n)
	}
	if err := g.start(ctx); err != nil {
		return nil, err
	}
	clk := newClock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gat := newGather(ctx, concurrent(gen), clk)
	trajs := make([]env.Trajectory, len(tasks)*n)
	ok := make([]bool, len(trajs))
	var failed, retried, done atomic.Int64
	var genNanos, wallNanos atomic.Int64
	var fatal error
	var fatalOnce sync.Once
	sem := make(chan struct{}, g.cfg.Concurrency)
	var wg sync.WaitGroup
	if opts.Progress != nil {
		opts.Progress(0, len(trajs))
	}
	for ti := range tasks {
		uid := strconv.Itoa(opts.TaskOffset+ti) + ":" + tasks[ti].ID
		for s := 0; s < n; s++ {
			i := ti*n + s
			trajs[i] = env.Trajectory{UID: uid, TrajUID: uid + "#" + strconv.Itoa(s), TaskIndex: ti, TaskID: tasks[ti].ID, Sample: s}
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				defer func() { <-sem }()
				began := time.Now()
				st, err := g.episode(ctx, gat, clk, opts, &tasks[ti], &trajs[i])
				wallNanos.Add(int64(time.Since(began)))
				genNanos.Add(int64(st.gen))
				if st.attempts > 1 {
					retried.Add(1)
				}
				switch {
				case errors.Is(err, errUnreachable) || ctx.Err() != nil:
					fatalOnce.Do(func() { fatal = err; cancel() })
				case err != nil:
					failed.Add(1)
					log.Warn().Str("episode", trajs[i].TrajUID).Int("attempts", st.attempts).Err(err).Msg("gateway: episode failed every attempt: left out of the rollout (rollout/gateway/failed_episodes)")
				default:
					ok[i] = true
				}
				if opts.Progress != nil {
					opts.Progress(int(done.Add(1)), len(trajs))
				}
			}()
		}
	}
	wg.Wait()
	if fatal != nil {
		if err := ctx.Err(); err != nil && !errors.Is(fatal, errUnreachable) {
			return nil, err
		}
		return nil, fmt.Errorf("gateway: %w (runner %s)", fatal, g.cfg)
	}
	stats := env.RewardStats{MetricFailed: float64(failed.Load()), MetricRetried: float64(retried.Load()),
		MetricGenShare: float64(genNanos.Load()) / max(float64(wallNanos.Load()), 1)}
	return g.collect(opts.Iteration, n, tasks, trajs, ok, stats, clk)
}

// collect makes the rollout of the episodes that succeeded (ok), with the gateway's counters and the
// time split; none succeeding is an error.
func (g *Gateway) collect(iteration, n int, tasks []env.Task, trajs []env.Trajectory, ok []bool, stats env.RewardStats, clk *clock) (*env.Rollout, error) {
	r := &env.Rollout{Iteration: iteration, N: n, Agents: g.Agents(), Tasks: tasks, RewardStats: stats}
	for i := range trajs {
		if ok[i] {
			r.Trajectories = append(r.Trajectories, trajs[i])
		}
	}
	if len(r.Trajectories) == 0 {
		return nil, fmt.Errorf("gateway: every one of the %d episodes failed (runner %s): see the warnings for why", len(trajs), g.cfg)
	}
	for k, v := range clk.split() {
		r.RewardStats[k] = v
	}
	return r, nil
}

// episodeStats are one episode's attempts and the time its calls spent generating.
type episodeStats struct {
	attempts int
	gen      time.Duration
}

// episode plays one episode through the runner, attempt after attempt (each a new session: the
// calls of a failed attempt are dropped), and fills tr with its calls, reward and scores.
func (g *Gateway) episode(ctx context.Context, gat *gather, clk *clock, opts env.RunOptions, task *env.Task, tr *env.Trajectory) (episodeStats, error) {
	body, err := taskJSON(task)
	if err != nil {
		return episodeStats{}, err
	}
	var st episodeStats
	var last error
	for st.attempts < g.cfg.Attempts {
		st.attempts++
		se := g.srv.open(gat, clk, opts, tr.TaskID, tr.Sample)
		proc := g.runner.current()
		gat.begin()
		reply, err := g.runner.play(ctx, runRequest{EpisodeID: tr.TrajUID, Task: body, BaseURL: g.srv.baseURL(se), APIKey: se.key,
			Agents: g.Agents(), Seed: env.SampleSeed(opts, "runner", tr, 0)}, g.agents)
		gat.end()
		calls := g.srv.end(se)
		st.gen += se.genTime
		if err == nil && reply.Calls != nil && len(reply.Calls) != len(calls) {
			err = fmt.Errorf("the answer's calls has %d entries; the episode made %d calls (one entry per call, in the order they were served)", len(reply.Calls), len(calls))
		}
		if err == nil {
			g.finish(tr, calls, reply)
			return st, nil
		}
		last = err
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if st.attempts < g.cfg.Attempts { // a runner drmas started that died: its restart, before the next attempt
			if err := g.runner.recover(ctx, proc, errors.Is(err, errBroken) || errors.Is(err, errUnreachable)); err != nil {
				return st, fmt.Errorf("%w: %s: %v", errUnreachable, g.cfg.URL, err)
			}
		}
	}
	return st, last
}

// finish fills a trajectory from the episode's calls and the runner's answer: a call's role reward is
// its own entry in calls, else its agent's in agent_rewards; a call the runner found malformed is
// invalid.
func (g *Gateway) finish(tr *env.Trajectory, calls []env.Call, reply runReply) {
	tr.Calls = calls
	tr.Reward, tr.Success, tr.Answered = reply.Reward, reply.Success, true
	for i := range tr.Calls {
		c := &tr.Calls[i]
		c.RoleReward = reply.AgentRewards[c.Agent]
		if reply.Calls == nil {
			continue
		}
		if v := reply.Calls[i].RoleReward; v != nil {
			c.RoleReward = *v
		}
		if v := reply.Calls[i].Valid; v != nil {
			c.Valid = c.Valid && *v // a malformed tool call stays invalid
		}
	}
	tr.Score(func(agent string) float64 { return g.agents[agent].roleWeight }, g.penalty, nil)
}

// taskJSON is the task as the runner gets it: the data record exactly as it stands in data.train
// (env.Task.Record), or, for a generated task, its fields.
func taskJSON(t *env.Task) (json.RawMessage, error) {
	if len(t.Record) > 0 {
		return t.Record, nil
	}
	return json.Marshal(t)
}

// concurrent is gen serving concurrent calls in shared batches, where it can (a local policy's
// continuous batching: Concurrent); an engine's client batches on its server already.
func concurrent(gen llm.Generator) llm.Generator {
	if c, ok := gen.(interface{ Concurrent() llm.Generator }); ok {
		return c.Concurrent()
	}
	return gen
}
