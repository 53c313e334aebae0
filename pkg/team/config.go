// Package team is what a run config says of the team and the world it plays in — its agents, the
// orchestra that plays them, the tasks (a dataset, or a toy task), the retriever its searches use,
// where its reward comes from and the tools its agents call — and how that is opened: the one
// construction of an orchestra that training, evaluation and the dry-run checker share (Open). Pure
// Go: the agents' models are pkg/train's.
package team

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
	"github.com/drmas/drmas/pkg/env/toy"
	"github.com/drmas/drmas/pkg/gateway"
	"github.com/drmas/drmas/pkg/judge"
	"github.com/drmas/drmas/pkg/tool"
	"github.com/drmas/drmas/pkg/toolcall"
)

// Config is the team's sections of a run config (top-level keys: agents, orchestra, data, toy,
// retriever, reward, tools).
type Config struct {
	Agents    []Agent    `mapstructure:"agents"`
	Orchestra Orchestra  `mapstructure:"orchestra"`
	Data      Data       `mapstructure:"data"`
	Toy       toy.Config `mapstructure:"toy"`
	Retriever Retriever  `mapstructure:"retriever"`
	// Reward is where the team's outcome reward comes from: the orchestra's rule checker (type rule),
	// an LLM judge or a remote endpoint (pkg/judge, docs/rewards.md).
	Reward judge.Config `mapstructure:"reward"`
	// Tools bounds the function tools of flow steps with tools and names the MCP servers that add to
	// the built-in ones (docs/tools.md).
	Tools tool.Config `mapstructure:"tools"`
}

// Agent is one entry of `agents:`: the env's agent settings plus per-agent training overrides.
type Agent struct {
	env.AgentConfig `mapstructure:",squash"`
	Train           algo.AgentTrain `mapstructure:"train"`
}

// Data is the `data:` section: datasets on disk (a toy task generates its own, see Toy).
type Data struct {
	Train  string     `mapstructure:"train"`
	Val    []string   `mapstructure:"val"`
	Fields DataFields `mapstructure:"fields"`
	Shape  string     `mapstructure:"shape"` // auto | gsm8k | math | qa | plain
	Limit  int        `mapstructure:"limit"` // questions read per file; 0 = all
	// MaxPromptLength bounds a rendered prompt in tokens (verl's max_prompt_length); 0 = the model's
	// context less the agent's max_new_tokens at load, and for the memory plan the prompts measured
	// on the data (pkg/check.MeasurePrompts: the longest first turn, later turns bounded by the
	// orchestra).
	MaxPromptLength int `mapstructure:"max_prompt_length"`
	// FilterOverlongPrompts skips (and counts) records whose prompt exceeds the bound instead of
	// refusing the dataset (verl's filter_overlong_prompts).
	FilterOverlongPrompts bool `mapstructure:"filter_overlong_prompts"`
}

// DataFields names the dataset fields (dotted paths allowed); empty = the shape's default.
type DataFields struct {
	ID       string `mapstructure:"id"`
	Question string `mapstructure:"question"`
	Answer   string `mapstructure:"answer"`
}

// Retriever is the `retriever:` section of the search orchestra.
type Retriever struct {
	Type     string        `mapstructure:"type"` // embedded | http | facts | none
	Corpus   string        `mapstructure:"corpus"`
	IndexDir string        `mapstructure:"index_dir"`
	URL      string        `mapstructure:"url"`
	Timeout  time.Duration `mapstructure:"timeout"`  // per attempt; a unit (30s) or a number of seconds
	Retries  int           `mapstructure:"retries"`  // tries at least
	Deadline time.Duration `mapstructure:"deadline"` // keep trying an unreachable server this long after the first try
}

// Orchestra is the `orchestra:` section: the built-in orchestras' keys (pkg/env) and, for the
// gateway orchestra (orchestra.type: gateway), its runner (pkg/gateway).
type Orchestra struct {
	env.OrchestraConfig `mapstructure:",squash"`
	Runner              *gateway.Config `mapstructure:"runner"`
}

// Defaults is what the team's sections are decoded over.
func Defaults() Config {
	return Config{Orchestra: Orchestra{OrchestraConfig: env.DefaultOrchestraConfig()}, Toy: toy.Defaults(), Reward: judge.Defaults(),
		Retriever: Retriever{Type: "", Timeout: 30 * time.Second, Retries: 3, Deadline: 2 * time.Minute}}
}

// IsToy reports whether the team's tasks are a generated toy task.
func (c Config) IsToy() bool { return c.Toy.Task != "" }

// AgentNames are the agents' names, in config order.
func (c Config) AgentNames() []string {
	out := make([]string, len(c.Agents))
	for i, a := range c.Agents {
		out[i] = a.Name
	}
	return out
}

// EnvAgents returns the agents' env settings, for building the orchestra. An agent without a
// tool_format gets its model family's (toolcall.FormatFor of the model_type modelType gives for its
// model), when one is known.
func (c Config) EnvAgents(modelType func(model string) string) []env.AgentConfig {
	out := make([]env.AgentConfig, len(c.Agents))
	for i, a := range c.Agents {
		out[i] = a.AgentConfig
		out[i].MaxPromptTokens = c.Data.MaxPromptLength
		if out[i].ToolFormat == "" && modelType != nil {
			if f, err := toolcall.FormatFor(modelType(a.Model)); err == nil {
				out[i].ToolFormat = string(f)
			}
		}
	}
	return out
}

// maxRetrieverTimeout bounds retriever.timeout, in seconds.
const maxRetrieverTimeout = 3600.0

// Validate checks the team's sections and that they fit each other (the agents play the
// orchestra's roles; the retriever is the one the orchestra needs), each problem naming its key.
// agents are the agents' env settings as the orchestra takes them (EnvAgents).
func (c Config) Validate(agents []env.AgentConfig) error {
	var ck choice.Problems
	ck.Add(env.ValidateAgents(agents))
	c.checkOrchestra(&ck)
	c.checkData(&ck)
	c.checkRetriever(&ck)
	ck.Add(c.Reward.Validate())
	ck.Add(c.Tools.Validate("tools"))
	return ck.Err()
}

// checkOrchestra checks the orchestra section and that the agents play its roles.
func (c Config) checkOrchestra(ck *choice.Problems) {
	if err := c.Orchestra.Validate(); err != nil {
		ck.Add(err)
		return
	}
	switch r := c.Orchestra.Runner; {
	case c.Orchestra.Type == gateway.Type && r == nil:
		ck.Bad("orchestra.runner", "required by the gateway orchestra: {url: http://127.0.0.1:PORT} of the runner that plays the episodes (docs/gateway.md)")
	case c.Orchestra.Type == gateway.Type:
		ck.Add(r.Validate("orchestra.runner"))
	case r != nil:
		ck.Bad("orchestra.runner", "only the gateway orchestra has a runner (type is %q)", c.Orchestra.Type)
	}
	roles := env.Roles(c.Orchestra.Type)
	if roles == nil { // flow: its steps name the agents
		return
	}
	names := map[string]bool{}
	for i, a := range c.Agents {
		names[a.Name] = true
		if a.Name != "" && !slices.Contains(roles, a.Name) {
			ck.Bad(fmt.Sprintf("agents[%d].name", i), "%q is not a role of the %s orchestra (roles: %s)", a.Name, c.Orchestra.Type, strings.Join(roles, ", "))
		}
	}
	for _, role := range roles {
		if !names[role] {
			ck.Bad("agents", "the %s orchestra needs an agent named %q", c.Orchestra.Type, role)
		}
	}
}

func (c Config) checkData(ck *choice.Problems) {
	if c.IsToy() {
		ck.Add(c.Toy.Validate())
		if c.Data.Train != "" || len(c.Data.Val) > 0 {
			ck.Bad("data", "a toy task (toy.task) generates its own data: leave data.train and data.val empty")
		}
		return
	}
	if c.Data.Train == "" {
		ck.Bad("data.train", "required (a JSONL or Parquet file), or set toy.task for a generated toy task")
	}
	if c.Data.Shape != "" {
		ck.OneOf("data.shape", c.Data.Shape, dataset.Shapes)
	}
	ck.AtLeast("data.limit", c.Data.Limit, 0)
	ck.IntIn("data.max_prompt_length", c.Data.MaxPromptLength, 0, 1<<22)
}

func (c Config) checkRetriever(ck *choice.Problems) {
	rt := c.Retriever
	if rt.Type != "" {
		ck.Registered("retriever.type", rt.Type, retriever.RunTypes)
	}
	none := rt.Type == "" || rt.Type == retriever.TypeNone
	switch use := env.OrchestraRetrieval(c.Orchestra.Type); {
	case use == env.NeedsRetriever && none:
		ck.Bad("retriever.type", "the %s orchestra needs a retriever: embedded, http or facts", c.Orchestra.Type)
	case rt.Type == retriever.TypeEmbedded && rt.Corpus == "":
		ck.Bad("retriever.corpus", "required for the embedded retriever (a JSONL file of {\"id\", \"contents\"})")
	case rt.Type == retriever.TypeHTTP && rt.URL == "":
		ck.Bad("retriever.url", "required for the http retriever (e.g. http://127.0.0.1:8000/retrieve)")
	case rt.Type == retriever.TypeHTTP:
		if err := retriever.CheckURL(rt.URL); err != nil {
			ck.Bad("retriever.url", "%v", err)
		}
	case rt.Type == retriever.TypeFacts && !c.IsToy():
		ck.Bad("retriever.type", "facts retrieves from a toy task's own facts: set toy.task, or use embedded or http")
	case !none && use == env.NoRetrieval:
		ck.Bad("retriever.type", "the %s orchestra does not search: remove the retriever section", c.Orchestra.Type)
	}
	if s := rt.Timeout.Seconds(); !(s > 0 && s <= maxRetrieverTimeout) {
		ck.Bad("retriever.timeout", "must be in (0s, 1h] (got %s)", rt.Timeout)
	}
	ck.IntIn("retriever.retries", rt.Retries, 1, 100)
	if s := rt.Deadline.Seconds(); !(s >= 0 && s <= 24*3600) {
		ck.Bad("retriever.deadline", "must be in [0s, 24h], 0 = retries only (got %s)", rt.Deadline)
	}
}
