package env

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/rs/zerolog/log"
)

// Orchestra runs a team of agents over a batch of tasks through the Generator seam.
type Orchestra interface {
	// Run plays n trajectories of every task (n is the GRPO group size) and scores every call.
	// Episodes advance together: at each step every agent gets all its pending prompts in one
	// Generate call. Run keeps no state between calls, so concurrent runs are safe.
	Run(ctx context.Context, gen llm.Generator, tasks []Task, n int, opts RunOptions) (*Rollout, error)
	// Agents lists the agent names in config order.
	Agents() []string
	// Schedule returns the curriculum in force at a training iteration (zero when there is none).
	Schedule(iteration int) Schedule
}

// RunOptions says which run a rollout belongs to.
type RunOptions struct {
	// Iteration is the training iteration; it picks the curriculum and seeds the samples.
	Iteration int
	// Seed is the run's seed. Each request's Sampling.Seed is derived from (Seed, Iteration, agent,
	// task id, sample, call number), so a rerun draws the same samples whatever the batching.
	Seed int64
	// Eval turns the curriculum off.
	Eval bool
	// TaskOffset is the index of tasks[0] in a larger set; it keeps group ids unique across batches.
	TaskOffset int
	// Progress, when set, is called at the start (0 done) and as each trajectory finishes, with how many
	// have and of how many.
	Progress func(done, total int)
}

// orchestraType is one registered orchestra: its constructor, its fixed roles (none for flow, whose
// agents come from config), its default invalid-action penalty and what it needs of a retriever.
type orchestraType struct {
	build     func(s setup) (Orchestra, error)
	roles     []Role
	penalty   float64
	retrieval Retrieval
}

// Retrieval is what an orchestra type needs of the run's retriever (retriever.type).
type Retrieval int

const (
	NoRetrieval    Retrieval = iota // never searches: a retriever is a config mistake
	MayRetrieve                     // searches when its steps say so (flow)
	NeedsRetriever                  // searches every episode: a run without a retriever is refused
)

// orchestras is the registry: a new orchestra is one file plus one line here.
var orchestras = map[string]orchestraType{
	"math":   {newMath, mathRoles, 0.1, NoRetrieval},
	"search": {newSearch, searchRoles, 0.01, NeedsRetriever},
	"flow":   {newFlow, nil, 0.1, MayRetrieve},
	"dial":   {newDial, dialRoles, 0.1, NoRetrieval},
}

// External is an orchestra type another package implements (pkg/gateway): built from the
// orchestra section, the agents, the type's own section (WithSection; nil when the config has none)
// and the resolved invalid-call penalty.
type External struct {
	Build     func(cfg OrchestraConfig, agents []AgentConfig, section any, penalty float64) (Orchestra, error)
	Penalty   float64
	Retrieval Retrieval
}

// Register adds an orchestra type implemented elsewhere and returns its name: such an orchestra is
// its package plus one line, `var Type = env.Register("name", env.External{...})`.
func Register(name string, e External) string {
	if _, dup := orchestras[name]; dup || name == "" {
		panic(fmt.Sprintf("env: orchestra %q registered twice or empty", name))
	}
	orchestras[name] = orchestraType{penalty: e.Penalty, retrieval: e.Retrieval,
		build: func(s setup) (Orchestra, error) { return e.Build(s.cfg, s.agents, s.section, s.penalty) }}
	return name
}

// OrchestraRetrieval says what an orchestra type needs of a retriever (NoRetrieval for an unknown type).
func OrchestraRetrieval(typ string) Retrieval { return orchestras[typ].retrieval }

// Roles lists the agent names an orchestra type needs, in its order; nil for flow (its steps name
// the agents) and for an unknown type.
func Roles(typ string) []string {
	var out []string
	for _, r := range orchestras[typ].roles {
		out = append(out, r.Name)
	}
	return out
}

// OrchestraTypes lists the registered orchestra types, sorted.
func OrchestraTypes() []string {
	out := make([]string, 0, len(orchestras))
	for k := range orchestras {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// setup is what a constructor gets: the validated config, its agents, the retriever (may be nil)
// and the resolved penalty.
type setup struct {
	cfg     OrchestraConfig
	agents  []AgentConfig
	retr    Retriever
	tools   Toolbox // nil: the built-in tools over retr
	penalty float64
	section any // an External type's own section (WithSection)
}

// Option sets up an orchestra beyond its config.
type Option func(*setup)

// WithTools gives a flow's tool steps their toolbox (pkg/tool's Box, which pkg/team opens).
func WithTools(tb Toolbox) Option { return func(s *setup) { s.tools = tb } }

// WithSection gives an External orchestra type its own section of the config.
func WithSection(v any) Option { return func(s *setup) { s.section = v } }

// NewOrchestra validates the config and builds the orchestra it names. retr may be nil for an
// orchestra that never searches; a TaskRetriever (e.g. FactRetriever) searches each task's own facts.
func NewOrchestra(cfg OrchestraConfig, agents []AgentConfig, retr Retriever, opts ...Option) (Orchestra, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := orchestras[cfg.Type]
	s := setup{cfg: cfg, agents: agents, retr: retr, penalty: cfg.Penalty()}
	for _, opt := range opts {
		opt(&s)
	}
	return o.build(s)
}

// team is the machinery the orchestras share: bound agents, batched generation, retrieval, scoring.
type team struct {
	typ     string
	cfg     OrchestraConfig
	agents  []*Agent
	byName  map[string]*Agent
	penalty float64
	style   style
	retr    Retriever
}

func newTeam(typ string, s setup, roles []Role) (*team, error) {
	agents, err := bindAgents(typ, roles, s.agents, s.cfg.Prompts)
	if err != nil {
		return nil, err
	}
	t := &team{typ: typ, cfg: s.cfg, agents: agents, byName: map[string]*Agent{}, penalty: s.penalty,
		style: style{toy: s.cfg.Prompts == PromptsToy}, retr: s.retr}
	for _, a := range agents {
		t.byName[a.Name] = a
	}
	return t, nil
}

// Agents lists the agent names in config order.
func (t *team) Agents() []string {
	out := make([]string, len(t.agents))
	for i, a := range t.agents {
		out[i] = a.Name
	}
	return out
}

// Schedule is always zero: the math, dial and flow orchestras have no curriculum (search has its own).
func (t *team) Schedule(int) Schedule { return Schedule{} }

// episode is one trajectory in progress.
type episode struct {
	task     *Task
	traj     *Trajectory
	entries  []entry // the team's context
	docs     []Doc   // everything retrieved so far
	turn     int
	last     string // the latest response under review (math verifier)
	answer   string // the latest answer given
	answered bool   // whether the latest answer call produced one
	correct  bool   // whether the latest answer is right
	run      *runCount
}

// runCount counts a Run's finished trajectories for RunOptions.Progress.
type runCount struct {
	done, total int
	report      func(done, total int)
}

// start makes the rollout and one episode per (task, sample).
func (t *team) start(tasks []Task, n int, opts RunOptions, sched Schedule) (*Rollout, []*episode, error) {
	if len(tasks) == 0 {
		return nil, nil, errors.New("run: no tasks")
	}
	if n < 1 {
		return nil, nil, fmt.Errorf("run: rollouts per task must be ≥ 1 (got %d)", n)
	}
	r := &Rollout{Iteration: opts.Iteration, N: n, Agents: t.Agents(), Tasks: tasks, Schedule: sched,
		Trajectories: make([]Trajectory, len(tasks)*n)}
	eps := make([]*episode, len(r.Trajectories))
	count := &runCount{total: len(eps), report: opts.Progress}
	for ti := range tasks {
		uid := strconv.Itoa(opts.TaskOffset+ti) + ":" + tasks[ti].ID
		for s := 0; s < n; s++ {
			i := ti*n + s
			r.Trajectories[i] = Trajectory{UID: uid, TrajUID: uid + "#" + strconv.Itoa(s), TaskIndex: ti,
				TaskID: tasks[ti].ID, Sample: s}
			eps[i] = &episode{task: &tasks[ti], traj: &r.Trajectories[i], turn: 1, run: count}
		}
	}
	if opts.Progress != nil {
		opts.Progress(0, len(eps))
	}
	return r, eps, nil
}

// pending is a call an episode waits for.
type pending struct {
	ep    *episode
	agent *Agent
	data  PromptData
	// messages, when set, are the conversation to continue (an agent calling tools) instead of the
	// rendered prompt as one user message.
	messages []llm.Message
}

// generate renders the pending prompts, asks each agent for all of its prompts in one Generate call
// (agents in config order), appends the parsed calls to the trajectories and returns each call's
// index in its trajectory, aligned with ps.
func (t *team) generate(ctx context.Context, gen llm.Generator, ps []pending, opts RunOptions) ([]int, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prompts := make([]string, len(ps))
	for i, p := range ps {
		s, err := p.agent.Render(p.data)
		if err != nil {
			return nil, err
		}
		prompts[i] = s
	}
	idx := make([]int, len(ps))
	for _, a := range t.agents {
		var which []int
		var reqs []llm.Request
		for i, p := range ps {
			if p.agent != a {
				continue
			}
			samp := a.Sampling
			samp.Seed = deriveSeed(opts, a.Name, p.ep.traj, len(p.ep.traj.Calls))
			which = append(which, i)
			msgs := p.messages
			if msgs == nil {
				msgs = []llm.Message{{Role: "user", Content: prompts[i]}}
			}
			reqs = append(reqs, llm.Request{Agent: a.Name, Model: a.Model, Sampling: samp, ChatTemplateKwargs: a.ChatTemplateKwargs,
				Messages: msgs, FitContext: true, MaxPromptTokens: a.MaxPromptTokens})
		}
		if len(reqs) == 0 {
			continue
		}
		comps, err := gen.Generate(ctx, reqs)
		if err != nil {
			return nil, fmt.Errorf("generate %s: %w", a.Name, err)
		}
		if len(comps) != len(reqs) {
			return nil, fmt.Errorf("generate %s: %d completions for %d requests", a.Name, len(comps), len(reqs))
		}
		for k, i := range which {
			p, c := ps[i], comps[k]
			parsed, valid := a.Parse(c.Text)
			if c.Finish == llm.FinishOverlong { // the episode's prompt outgrew the model's context
				parsed, valid = "", false
				log.Warn().Str("task", p.ep.task.ID).Str("agent", a.Name).Int("turn", p.data.Turn).Int("prompt_tokens", len(c.PromptIDs)).
					Msg("the agent's prompt leaves no room in its model's context or is over data.max_prompt_length: the call is invalid, nothing generated (counted in rollout/overlong_calls)")
			}
			idx[i] = len(p.ep.traj.Calls)
			p.ep.traj.Calls = append(p.ep.traj.Calls, Call{Agent: a.Name, Model: a.Model, Turn: p.data.Turn,
				Prompt: prompts[i], Messages: reqs[k].Messages, Response: c.Text, Parsed: parsed, Valid: valid,
				PromptIDs: c.PromptIDs, ResponseIDs: c.ResponseIDs, LogProbs: c.LogProbs, Finish: c.Finish, Replica: c.Replica, Version: c.Version, Routes: c.Routes})
		}
	}
	return idx, nil
}

// retrieve runs one batched search; queries are aligned with eps.
func (t *team) retrieve(ctx context.Context, eps []*episode, queries []string) ([][]Doc, error) {
	if len(queries) == 0 {
		return nil, nil
	}
	if t.retr == nil {
		return nil, errors.New("retrieve: the orchestra has no retriever")
	}
	var docs [][]Doc
	var err error
	if tr, ok := t.retr.(TaskRetriever); ok {
		tasks := make([]Task, len(eps))
		for i, e := range eps {
			tasks[i] = *e.task
		}
		docs, err = tr.RetrieveTasks(ctx, tasks, queries, t.cfg.TopK)
	} else {
		docs, err = t.retr.Retrieve(ctx, queries, t.cfg.TopK)
	}
	if err != nil {
		return nil, fmt.Errorf("retrieve: %w", err)
	}
	if len(docs) != len(queries) {
		return nil, fmt.Errorf("retrieve: %d results for %d queries", len(docs), len(queries))
	}
	for i := range docs {
		if len(docs[i]) > t.cfg.TopK {
			docs[i] = docs[i][:t.cfg.TopK]
		}
	}
	return docs, nil
}

// search runs the queries of the episodes (one each) as one batch. Each episode's last call, the
// query, earns its role reward when a document it retrieved holds the answer, and the documents come
// back to the episode as information.
func (t *team) search(ctx context.Context, eps []*episode, queries []string) error {
	docs, err := t.retrieve(ctx, eps, queries)
	if err != nil {
		return err
	}
	for i, e := range eps {
		c := &e.traj.Calls[len(e.traj.Calls)-1]
		c.RoleReward = b2f(hit(e.task, docs[i]))
		e.docs = append(e.docs, docs[i]...)
		e.entries = append(e.entries, entry{text: t.style.information(docs[i])})
	}
	return nil
}

// finish sets an episode's outcome and scores every call:
// score = (1 − w)·reward + w·role − penalty·[invalid].
func (t *team) finish(e *episode, answer string, answered, success bool) {
	tr := e.traj
	tr.Answer, tr.Answered, tr.Success, tr.Reward = answer, answered, success, 0
	if success {
		tr.Reward = 1
	}
	t.score(tr, nil)
	if c := e.run; c != nil && c.report != nil {
		c.done++
		c.report(c.done, c.total)
	}
}

// finishWhere finishes the episodes of active for which done(i, e) holds, each with its own
// answer, and returns the others, in order (reusing active's array).
func (t *team) finishWhere(active []*episode, done func(i int, e *episode) bool) []*episode {
	rest := active[:0]
	for i, e := range active {
		if done(i, e) {
			t.finish(e, e.answer, e.answered, e.correct)
		} else {
			rest = append(rest, e)
		}
	}
	return rest
}

// logRun reports a finished rollout at debug level.
func logRun(typ string, r *Rollout, began time.Time) {
	log.Debug().Str("orchestra", typ).Int("iteration", r.Iteration).Int("trajectories", len(r.Trajectories)).
		Float64("reward", r.MeanReward()).Dur("took", time.Since(began)).Msg("rollout")
}

// deriveSeed gives one request its sampling seed from the run, the agent, the trajectory and the
// call's position in it.
func deriveSeed(opts RunOptions, agent string, tr *Trajectory, call int) int64 {
	return SampleSeed(opts, agent, tr, call)
}

// SampleSeed is the sampling seed of an episode's call: a function of the run's seed and iteration,
// the agent, the trajectory (task and sample) and the call's position in the trajectory, the same
// whatever the batching and whoever plays the episode (an outside runner through pkg/gateway draws
// what the built-in orchestras draw).
func SampleSeed(opts RunOptions, agent string, tr *Trajectory, call int) int64 {
	return int64(hashOf(opts.Seed, int64(opts.Iteration), agent, tr.TaskID, int64(tr.Sample), int64(call)) >> 1)
}

// draw is a uniform number in [0, 1) fixed by the run, a purpose and a trajectory.
func draw(opts RunOptions, purpose string, tr *Trajectory) float64 {
	h := hashOf(opts.Seed, int64(opts.Iteration), purpose, tr.TaskID, int64(tr.Sample))
	return float64(h>>11) / (1 << 53)
}

// hashOf is FNV-1a over the parts, each framed so that ("ab","c") and ("a","bc") differ.
func hashOf(parts ...any) uint64 {
	h := fnv.New64a()
	var buf [8]byte
	for _, p := range parts {
		switch v := p.(type) {
		case int64:
			binary.LittleEndian.PutUint64(buf[:], uint64(v))
			h.Write(buf[:])
		case string:
			binary.LittleEndian.PutUint64(buf[:], uint64(len(v)))
			h.Write(buf[:])
			h.Write([]byte(v))
		}
	}
	x := h.Sum64()
	// splitmix64 finalizer: FNV's low bits mix poorly.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// anyMatch reports whether a final answer matches a task's gold answers under a matcher.
func anyMatch(match func(pred, gold string) bool, pred string, golds []string) bool {
	for _, g := range golds {
		if match(pred, g) {
			return true
		}
	}
	return false
}

// CheckPrompts renders every agent's prompt template of an orchestra with sample data, so that a
// template naming a field PromptData lacks fails before any model runs (`drmas train --dry-run`).
func CheckPrompts(o Orchestra) error {
	t, ok := RuleOrchestra(o).(interface{ checkPrompts() error })
	if !ok {
		return nil
	}
	return t.checkPrompts()
}

func (t *team) checkPrompts() error {
	sample := PromptData{Question: "What is 2 + 3?", Context: "<information>Doc 1: 2 + 3 = 5</information>",
		Response: `\boxed{5}`, Turn: 1, MaxTurns: 4}
	var errs []error
	for i, a := range t.agents {
		if _, err := a.Render(sample); err != nil {
			errs = append(errs, fmt.Errorf("agents[%d].prompt: %w", i, err))
		}
	}
	return errors.Join(errs...)
}
