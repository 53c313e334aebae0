package plan

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/team"
)

// Model is one configured model's share of its device.
type Model struct {
	ID                    string `json:"id"`
	Index                 int    `json:"index"` // models[index]
	Device                string `json:"device"`
	DType                 string `json:"dtype"`
	Params                int64  `json:"params"`         // trained parameters (an adapter's A and B; a frozen base's weights)
	Role                  string `json:"role,omitempty"` // a LoRA adapter or a frozen base: what its line holds
	Base                  string `json:"base,omitempty"` // a LoRA adapter's base model id
	GradientCheckpointing bool   `json:"gradient_checkpointing"`
	MicroBatch            int    `json:"micro_batch"`     // sequences per forward/backward
	PromptTokens          int    `json:"prompt_tokens"`   // the longest prompt the config allows
	ResponseTokens        int    `json:"response_tokens"` // the longest response (max_new_tokens)
	PromptBound           string `json:"prompt_bound"`    // where PromptTokens comes from
	RolloutRows           int    `json:"rollout_rows"`    // sequences in one Generate call (0: a remote engine)
	Parts
	// Keys are the config keys that change this model's share (for the error of a plan that does
	// not fit).
	keys      []string
	microKeys []string // the keys that set its micro-batch
	budgetKey string   // the key that sets its token budget ("": none set)
	in        input
}

// Where a model's prompt bound comes from.
const (
	boundKey     = "data.max_prompt_length"
	boundToy     = "toy prompts, measured"
	boundData    = "data's prompts, measured (first turn + later turns)"
	boundContext = "max_position_embeddings - max_new_tokens"
)

// buildModel works out models[i]'s share of its device and the config keys that change it.
func buildModel(cfg *config.Config, i int, mc model.Config, opt Options, measured map[int]int) (Model, error) {
	adapter, frozen := mc.IsAdapter(), cfg.IsFrozenBase(mc.ID)
	mc = cfg.WeightsOf(mc) // an adapter runs with its base's architecture, dtype and device
	m, in, err := newModel(i, mc, opt, frozen)
	if err != nil {
		return Model{}, err
	}
	in.shard = cfg.Dist.Shard
	in.gatherWhole = cfg.Dist.RolloutGather == "model"
	in.budget = int64(cmp.Or(mc.MaxTokensPerMicroBatch, cfg.Algorithm.MaxTokensPerMicroBatch))
	if in.budget > 0 {
		m.keys = append(m.keys, fmt.Sprintf("max_tokens_per_micro_batch (%d)", in.budget))
		m.budgetKey = "algorithm.max_tokens_per_micro_batch"
		if mc.MaxTokensPerMicroBatch > 0 {
			m.budgetKey = fmt.Sprintf("models[%d].max_tokens_per_micro_batch", i)
		}
	}
	users := []string{mc.ID} // the model ids whose agents this entry's figures follow
	switch {
	case frozen:
		users = cfg.AdaptersOf(mc.ID)
		m.Role = "frozen base of " + strings.Join(users, ", ") + ": weights only (no gradients, optimizer or master copy); holds the adapters' rollout"
	case adapter:
		if err := m.asAdapter(&in, mc); err != nil {
			return Model{}, err
		}
	}
	m.keys = append(m.keys, fmt.Sprintf("models[%d].gradient_checkpointing", i))
	if !mc.GradientCheckpointing {
		m.keys[0] += " (false)"
	}
	al := cfg.Algorithm
	local := mc.Rollout.Engine == "" || mc.Rollout.Engine == "local"
	var roll *rolloutSize
	if local && !adapter { // an adapter's rollout runs on its base's line
		val := valRows(cfg.Run, cfg.Config)
		roll = &rolloutSize{rows: rolloutRows(al, val), batch: int64(al.BatchSize), group: int64(al.GroupSize), valRows: val}
	}
	rule := promptRule{maxLength: cfg.Data.MaxPromptLength, toy: cfg.IsToy(), measured: measured}
	agents := m.addAgents(&in, cfg.Agents, al, users, rule, roll)
	if in.t == 0 {
		return Model{}, errors.New("no agent uses this model")
	}
	// Exact per-agent norms (parameter sharding measures every share exactly, whatever agent_norms).
	in.exactShares = (cfg.Dist.AgentNorms == "exact" || in.shardsParameters()) && (agents > 1 || al.Guard.Window > 0)
	m.keys = append(m.keys, fmt.Sprintf("%s (%s)", boundKey, orNone(cfg.Data.MaxPromptLength)))
	if local {
		m.keys = append(m.keys, fmt.Sprintf("algorithm.batch_size × group_size (%d × %d), run.val_k (%d) or models[%d].rollout.engine (local: the rollout KV cache is on this device)",
			al.BatchSize, al.GroupSize, cfg.Run.ValK, i))
	}
	if local && in.rows > 0 {
		in.maxBatch, in.kvTokens = int64(mc.Rollout.MaxBatch), mc.Rollout.KVTokens
		m.keys = append(m.keys, fmt.Sprintf("models[%d].rollout.max_batch (%s) or kv_tokens (%s): rows and KV positions of generation in flight", i, orNone(mc.Rollout.MaxBatch), orNone(int(mc.Rollout.KVTokens))))
	}
	m.keys = append(m.keys, fmt.Sprintf("models[%d].device (%s)", i, m.Device))
	m.MicroBatch, m.RolloutRows = int(in.b), int(in.rows)
	if err := in.checkSizes(i); err != nil { // before share's int64 products can wrap around
		return Model{}, err
	}
	m.in = in
	m.Parts = in.share()
	return m, nil
}

// newModel starts models[i]'s entry from its architecture, dtype and device, with the input of its
// share that these give.
func newModel(i int, mc model.Config, opt Options, frozen bool) (Model, input, error) {
	pc, err := modelConfig(mc)
	if err != nil {
		return Model{}, input{}, err
	}
	dt, err := arch.ParseDType(mc.DType)
	if err != nil {
		return Model{}, input{}, fmt.Errorf("dtype: %w", err)
	}
	dev := mc.Device
	if dev == "" {
		dev = opt.Device
	}
	dev, err = deviceName(dev, opt.CUDA)
	if err != nil {
		return Model{}, input{}, err
	}
	m := Model{ID: mc.ID, Index: i, Device: dev, DType: dt.String(), GradientCheckpointing: mc.GradientCheckpointing}
	m.Params, err = arch.ParamCount(pc)
	if err != nil {
		return Model{}, input{}, err
	}
	in := input{cfg: pc, e: int64(dt.Size()), master: dt != arch.Float32, checkpointing: mc.GradientCheckpointing,
		cpu: dev == "cpu", world: opt.WorldSize, offload: mc.Optim.Offload == "cpu", frozen: frozen}
	return m, in, nil
}

// asAdapter makes the entry a LoRA adapter's: it trains its A and B tensors only.
func (m *Model) asAdapter(in *input, mc model.Config) error {
	var err error
	if in.lora, err = arch.LoRAShapes(in.cfg, mc.LoRA.Rank, mc.LoRA.TargetModules); err != nil {
		return err
	}
	m.Params, m.Base = 0, mc.Base
	for _, n := range in.lora {
		m.Params += n
	}
	m.Role = fmt.Sprintf("LoRA adapter on %s (rank %d): its A and B with gradients, AdamW state and masters; activations of the base's forward", mc.Base, mc.LoRA.Rank)
	return nil
}

// rolloutSize is the rollout a model's line generates: the rows of its largest Generate call, the
// training batch and group, and validation's rows.
type rolloutSize struct {
	rows, batch, group, valRows int64
}

// addAgents takes into the share every agent whose model is one of users: its micro-batch, KL
// reference, the longest sequence it trains on (its prompt bound by rule, and max_new_tokens) and,
// when the rollout runs on this model's line (roll not nil), its rows. It returns the number of
// those agents.
func (m *Model) addAgents(in *input, agents []team.Agent, al algo.Config, users []string, rule promptRule, roll *rolloutSize) int {
	microKey := false
	n := 0
	for j, a := range agents {
		if !slices.Contains(users, a.Model) {
			continue
		}
		n++
		b, kl := al.MicroBatchSize, al.KL.Coef
		if a.Train.MicroBatchSize > 0 {
			b = a.Train.MicroBatchSize
			m.keys = append(m.keys, fmt.Sprintf("agents[%d].train.micro_batch_size (%d)", j, b))
			m.microKeys = append(m.microKeys, fmt.Sprintf("agents[%d].train.micro_batch_size", j))
		} else if !microKey {
			m.keys = append(m.keys, fmt.Sprintf("algorithm.micro_batch_size (%d)", b))
			m.microKeys = append(m.microKeys, "algorithm.micro_batch_size")
			microKey = true
		}
		if a.Train.KLCoef != nil {
			kl = *a.Train.KLCoef
		}
		in.kl = in.kl || kl > 0
		in.b = max(in.b, int64(b))
		resp := a.Sampling.Resolve().MaxNewTokens
		m.keys = append(m.keys, fmt.Sprintf("agents[%d].sampling.max_new_tokens (%d)", j, resp))
		prompt, bound := rule.bound(j, in.cfg.MaxPositionEmbeddings, resp)
		if t := int64(prompt + resp); t > in.t || (t == in.t && bound == boundKey) {
			in.t, m.PromptTokens, m.ResponseTokens, m.PromptBound = t, prompt, resp, bound
		}
		in.r = max(in.r, int64(resp))
		in.p = max(in.p, int64(prompt))
		in.agents = append(in.agents, j)
		if roll != nil {
			in.rows = max(in.rows, roll.rows)
			in.batch, in.group, in.valRows = roll.batch, roll.group, roll.valRows
		}
	}
	return n
}

// promptRule says where agents' prompt bounds come from: data.max_prompt_length when set, else the
// prompts measured (by agent index: the toy's, or the data's), else the context less the response.
type promptRule struct {
	maxLength int
	toy       bool
	measured  map[int]int
}

// bound is agents[j]'s longest prompt and where it comes from, for a model of context positions and
// a response of resp tokens.
func (r promptRule) bound(j, context, resp int) (int, string) {
	switch n, ok := r.measured[j]; {
	case r.maxLength > 0:
		return r.maxLength, boundKey
	case ok && r.toy:
		return n, boundToy
	case ok:
		// No longer than the context allows: a later turn past it would fail the run anyway.
		return min(n, max(context-resp, 1)), boundData
	default:
		return max(context-resp, 1), boundContext
	}
}

func orNone(n int) string {
	if n <= 0 {
		return "unset"
	}
	return fmt.Sprint(n)
}

// rolloutRows is the largest batch of one Generate call: a training rollout gives each agent all
// batch_size × group_size trajectories at once (pkg/env/orchestra.go), validation EvalQuestions
// questions × val_k samples (fewer when val_limit or the toy's val split is smaller).
func rolloutRows(al algo.Config, val int64) int64 {
	return max(int64(al.BatchSize*al.GroupSize), val)
}

// valRows is the largest Generate call of validation (0 without validation).
func valRows(run config.RunConfig, tc team.Config) int64 {
	var rows int64
	if run.TestFreq > 0 && (len(tc.Data.Val) > 0 || tc.IsToy()) {
		q := EvalQuestions
		if run.ValLimit > 0 {
			q = min(q, run.ValLimit)
		}
		if tc.IsToy() && tc.Toy.Val > 0 {
			q = min(q, tc.Toy.Val)
		}
		rows = int64(q * max(run.ValK, 1))
	}
	return rows
}

// modelConfig reads a model's config.json, or builds the config of a randomly initialised model as
// training does (model.Init.ArchConfig; vocab_size 0 = its tokenizer's size).
func modelConfig(mc model.Config) (arch.Config, error) {
	if mc.Path != "" {
		return arch.ReadConfig(filepath.Join(mc.Path, "config.json"))
	}
	vocab := mc.Init.VocabSize
	if vocab == 0 {
		tok, err := tokenizer.Load(mc.Tokenizer)
		if err != nil {
			return arch.Config{}, fmt.Errorf("tokenizer (for init's vocab_size): %w", err)
		}
		vocab = tok.VocabSize()
	}
	return mc.Init.ArchConfig(vocab)
}

// deviceName resolves a device as torch.ParseDevice does, without asking libtorch how many CUDA
// devices there are (the plan may be for another machine): "auto" is cuda:0 when cuda() says so,
// else cpu; "cuda" is cuda:0.
func deviceName(s string, cuda func() bool) (string, error) {
	switch s = strings.ToLower(strings.TrimSpace(s)); {
	case s == "" || s == "auto":
		if cuda != nil && cuda() {
			return "cuda:0", nil
		}
		return "cpu", nil
	case s == "cpu":
		return s, nil
	case s == "cuda":
		return "cuda:0", nil
	case strings.HasPrefix(s, "cuda:"):
		var n int
		if _, err := fmt.Sscanf(s, "cuda:%d", &n); err != nil || n < 0 || fmt.Sprintf("cuda:%d", n) != s {
			return "", fmt.Errorf("device %q: want cuda:N with N ≥ 0", s)
		}
		return s, nil
	}
	return "", fmt.Errorf("device %q: want auto, cpu, cuda or cuda:N", s)
}
