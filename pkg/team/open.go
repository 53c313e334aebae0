package team

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
	"github.com/drmas/drmas/pkg/env/toy"
	"github.com/drmas/drmas/pkg/gateway"
	"github.com/drmas/drmas/pkg/judge"
	"github.com/drmas/drmas/pkg/tool"
)

// Team is a team's world opened: the orchestra that plays its agents (tools open, reward wrapped),
// the retriever its searches use, and, once loaded (Load), its training tasks and validation sets.
type Team struct {
	Orchestra env.Orchestra
	Retriever env.Retriever
	Tools     *tool.Box // the flow's function tools (nil: none); owns the MCP servers
	Train     []env.Task
	Val       []env.EvalSet
}

// Open opens the team's world: the retriever, the function tools and the orchestra over them.
// agents are the agents as the orchestra takes them (Config.EnvAgents). Close releases it.
func Open(c Config, agents []env.AgentConfig) (*Team, error) {
	retr, err := NewRetriever(c)
	if err != nil {
		return nil, err
	}
	t := &Team{Retriever: retr}
	if t.Tools, err = OpenTools(c, retr); err != nil {
		t.Close()
		return nil, err
	}
	if t.Orchestra, err = NewOrchestra(c, agents, retr, t.Tools); err != nil {
		t.Close()
		return nil, err
	}
	switch r := c.Reward; r.Type {
	case judge.TypeJudge:
		log.Info().Str("url", r.Judge.URL).Str("mode", r.Judge.Mode).Str("on_error", r.Judge.OnError).Msg("reward: LLM judge")
	case judge.TypeRemote:
		log.Info().Str("url", r.Remote.URL).Int("batch_size", r.Remote.BatchSize).Str("on_error", r.Remote.OnError).Msg("reward: remote endpoint")
	}
	return t, nil
}

// Close releases the orchestra (a gateway's endpoint and runner), the retriever and the tools
// (their MCP servers stop).
func (t *Team) Close() {
	if c, ok := env.RuleOrchestra(t.Orchestra).(io.Closer); ok {
		_ = c.Close()
	}
	if c, ok := t.Retriever.(io.Closer); ok {
		_ = c.Close()
	}
	if t.Tools != nil {
		_ = t.Tools.Close()
	}
}

// NewOrchestra builds the config's orchestra over retr and the tools of box (nil: none), its
// outcome reward the rule checker's or, with reward.type judge or remote, the judge's or the
// endpoint's. It is the one construction every orchestra of a run goes through: training,
// evaluation, the dry run's checks and the memory plan's prompt measurement.
func NewOrchestra(c Config, agents []env.AgentConfig, retr env.Retriever, box *tool.Box) (env.Orchestra, error) {
	var opts []env.Option
	if box != nil {
		opts = append(opts, env.WithTools(box))
	}
	if c.Orchestra.Runner != nil {
		opts = append(opts, env.WithSection(*c.Orchestra.Runner))
	}
	orch, err := env.NewOrchestra(c.Orchestra.OrchestraConfig, agents, retr, opts...)
	if err != nil {
		return nil, err
	}
	return judge.Wrap(orch, c.Reward)
}

// UsesTools says whether a step of the team's flow calls function tools.
func (c Config) UsesTools() bool {
	return c.Orchestra.Type == "flow" && slices.ContainsFunc(c.Orchestra.Flow.Steps, func(s env.FlowStep) bool { return len(s.Tools) > 0 })
}

// OpenTools opens the function tools of a flow whose steps use some: the built-in ones (lookup, and
// search over retr) and those of tools.mcp_servers, started (stdio) or connected (HTTP), listed and
// checked. Nil when no step uses a tool.
func OpenTools(c Config, retr env.Retriever) (*tool.Box, error) {
	if !c.UsesTools() {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	box, err := tool.Open(ctx, c.Tools, &tool.Builtins{Retriever: retr, TopK: c.Orchestra.TopK})
	if err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	log.Info().Strs("tools", box.Names()).Int("mcp_servers", len(c.Tools.Servers)).Msg("function tools ready")
	return box, nil
}

// NewRetriever builds the retriever section's retriever (nil: none).
func NewRetriever(c Config) (env.Retriever, error) {
	r := c.Retriever
	switch r.Type {
	case "", retriever.TypeNone:
		return nil, nil
	case retriever.TypeFacts:
		return env.FactRetriever{}, nil
	}
	ret, err := retriever.New(retriever.Config{Type: r.Type, Corpus: r.Corpus, IndexDir: r.IndexDir, URL: r.URL,
		Timeout: r.Timeout, Retries: r.Retries, Deadline: r.Deadline})
	if err != nil {
		return nil, fmt.Errorf("retriever: %w", err)
	}
	return ret, nil
}

// Load reads the training tasks and the validation sets, the first valLimit questions of each (0:
// all): a toy task generates its own; data files are read with the data section's fields, shape and
// limit and each record kept or refused by check (nil: all kept; pkg/check measures prompts).
func (t *Team) Load(c Config, valLimit int, check func(env.Task) (bool, error)) error {
	if c.IsToy() {
		var err error
		if t.Train, err = toy.Tasks(c.Toy, toy.Train); err != nil {
			return err
		}
		v, err := toy.Tasks(c.Toy, toy.Val)
		if err != nil {
			return err
		}
		t.Val = []env.EvalSet{{Name: c.Toy.Task, Tasks: FirstN(v, valLimit)}}
		return nil
	}
	opts := c.DataOptions(c.Data.Limit, check)
	var err error
	if t.Train, err = dataset.Load(c.Data.Train, opts); err != nil {
		return fmt.Errorf("data.train: %w", err)
	}
	if t.Val, err = ReadSets(c.Data.Val, opts, "data.val"); err != nil {
		return err
	}
	for i := range t.Val {
		t.Val[i].Tasks = FirstN(t.Val[i].Tasks, valLimit)
	}
	return nil
}

// DataOptions are how the data section's files are read: its fields and shape, limit records per
// file (0: all), each record kept or refused by check (nil: all kept; an over-long prompt is
// skipped under data.filter_overlong_prompts, the reason dataset counts it under).
func (c Config) DataOptions(limit int, check func(env.Task) (bool, error)) dataset.Options {
	o := dataset.Options{Fields: dataset.Fields(c.Data.Fields), Shape: dataset.Shape(c.Data.Shape), Limit: limit}
	if c.Orchestra.Type == gateway.Type && (o.Shape == "" || o.Shape == dataset.ShapeAuto) {
		o.Shape = dataset.ShapeRecord // the runner reads the record: no field is required
	}
	if check != nil {
		o.Check, o.SkipReason = check, "prompt longer than the limit (data.filter_overlong_prompts)"
	}
	return o
}

// FirstN is the first n tasks (n ≤ 0: all).
func FirstN(tasks []env.Task, n int) []env.Task {
	if n > 0 && len(tasks) > n {
		return tasks[:n]
	}
	return tasks
}

// ReadSets reads one evaluation set per file, named after the file; key, when set, names the list
// in errors (key[i]).
func ReadSets(paths []string, opts dataset.Options, key string) ([]env.EvalSet, error) {
	var sets []env.EvalSet
	for i, p := range paths {
		tasks, err := dataset.Load(p, opts)
		if err != nil && key != "" {
			return nil, fmt.Errorf("%s[%d]: %w", key, i, err)
		}
		if err != nil {
			return nil, err
		}
		sets = append(sets, env.EvalSet{Name: strings.TrimSuffix(filepath.Base(p), filepath.Ext(p)), Tasks: tasks})
	}
	return sets, nil
}
