package plan

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

// Activation coefficients: the bytes a decoder layer keeps for backward per token, in units of the
// weight dtype's size, are c_h·hidden + c_i·intermediate + c_a·(heads + 2·kv_heads)·head_dim. They
// count the tensors the layer saves: the residual inputs, the two RMSNorm inputs and outputs
// (float32 statistics in a half dtype count double), q/k/v before and after RoPE, the attention
// output and o_proj's input on the hidden side; gate, up, SiLU(gate) and their product on the MLP
// side. The lead calibrates them against measured peaks (pkg/policy/decoder.go is what they count).
const (
	ActHidden       = 10 // c_h
	ActIntermediate = 4  // c_i
	ActAttention    = 3  // c_a
)

const (
	// attnCopies: the attention work space of a tile holds its float32 scores [B, H, rows, S], their
	// probabilities, the probabilities' gradient and the scores' gradient (arch.AttentionTileRows
	// gives the rows).
	attnCopies = 4
	// logitsCopies: a chunk of logits (arch.LogitsChunkTokens tokens) holds its float32 logits,
	// their softmax and gradient.
	logitsCopies = 3
	// optimCopies: AdamW's float32 temporaries of one parameter's size.
	optimCopies = 3
	// EvalQuestions is how many questions validation runs through the orchestra at once
	// (env.EvalOptions' default batch, pkg/env/eval.go); each has run.val_k samples.
	EvalQuestions = 32
	// CPUOverhead is what a drmas process holds besides the plan's tensors on the CPU: the Go
	// runtime, libtorch's code and allocator caches, tokenizers and data (measured: peak RSS of a toy
	// run less its tensors; docs/memory-plan.md).
	CPUOverhead = 240_000_000
	// CUDAOverhead is the CUDA context, cuBLAS work space and the caching allocator's fragmentation
	// on a GPU, which the GPU's total memory also has to hold.
	CUDAOverhead = 1 << 30
)

// Options are the run-time inputs of a plan that are not in the config.
type Options struct {
	// Device is the --device flag: the device of the models whose config names none.
	Device string
	// CUDA reports whether libtorch sees a CUDA device (resolves "auto"); nil = no CUDA.
	CUDA func() bool
	// Memory gives device capacities instead of asking the machine (--device-memory): the key ""
	// is every device, any other key one device ("cpu", "cuda:1").
	Memory map[string]int64
	// HostRanks is the number of processes of the run that share this host's memory (drmas train
	// --nproc N, or a launcher's LOCAL_WORLD_SIZE): a CPU device holds each rank's share once per
	// rank. 0 = 1.
	HostRanks int
	// WorldSize is the number of data-parallel ranks (drmas train --nproc N, or a launcher's
	// WORLD_SIZE): with dist.shard each rank holds its partition of the training state. 0 = 1.
	WorldSize int
	// Capacity asks the machine for a device's memory (nil = Probe).
	Capacity func(device string) (bytes int64, source string, err error)
	// Prompts are the prompt lengths measured on the config's data (pkg/check.MeasurePrompts): an
	// agent's Bound, when known, is its prompt bound when data.max_prompt_length is unset.
	Prompts []MeasuredPrompt
}

// MeasuredPrompt is what the data's prompts of one agent measure, in tokens as its model encodes
// them (chat template with the generation prompt, then the tokenizer).
type MeasuredPrompt struct {
	Agent string `json:"agent"`
	Index int    `json:"index"` // agents[index]
	Model string `json:"model"`
	// FirstTurn is the longest first-turn prompt of the data: every record's question in the
	// agent's prompt with an empty team context (the orchestra's openings among them).
	FirstTurn int `json:"first_turn_tokens"`
	// Bound is the longest prompt of any turn: FirstTurn plus what the orchestra's later turns can
	// add (the team's earlier responses, each at most its max_new_tokens); 0 when the orchestra
	// cannot bound them (retrieved documents, tool results). Later says how.
	Bound        int    `json:"prompt_bound_tokens"`
	Later        string `json:"later_turns"`
	MaxNewTokens int    `json:"max_new_tokens"`
}

// Plan is the memory plan of a run: one entry per device and per model.
type Plan struct {
	Devices []Device `json:"devices"`
	Models  []Model  `json:"models"`
	// WorldSize and Shard: the data-parallel ranks the plan is for (each rank's figures) and
	// dist.shard.
	WorldSize int    `json:"world_size"`
	Shard     string `json:"shard"`
	// Notes say what the plan assumed (a prompt bound it had to guess, a device it cannot measure).
	Notes []string `json:"notes,omitempty"`
	// Prompts are the prompt lengths measured on the data (Options.Prompts).
	Prompts []MeasuredPrompt `json:"measured_prompts,omitempty"`
	// promptFloor is the least data.max_prompt_length the fix search may name: the data's longest
	// first-turn prompt (a lower bound would refuse its records), 0 with data.filter_overlong_prompts.
	promptFloor int64
}

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

// Parts is memory by what holds it, in bytes.
type Parts struct {
	Weights     int64 `json:"weights_bytes"`
	Master      int64 `json:"master_weights_bytes"`
	Gradients   int64 `json:"gradients_bytes"`
	Optimizer   int64 `json:"optimizer_bytes"`
	Reference   int64 `json:"reference_bytes"`
	Activations int64 `json:"activations_bytes"`    // what the layers keep for backward
	Attention   int64 `json:"attention_bytes"`      // the attention work space of one layer
	Logits      int64 `json:"logits_chunk_bytes"`   // one chunk of float32 logits
	OptimStep   int64 `json:"optimizer_step_bytes"` // AdamW's scratch for its largest parameter
	RolloutKV   int64 `json:"rollout_kv_bytes"`     // the KV cache of the largest Generate call
	DecodeCopy  int64 `json:"decode_copy_bytes"`    // CPU: the decoding layout of the weights
	// Reduce is data-parallel training's extra gradient memory during a model's update: the flat
	// all-reduce buffer, the exact-share accumulator (its partition under dist.shard: gradients),
	// and under gradients the reduced gradients of the parameters the rank does not own, which
	// backward needs whole.
	Reduce int64 `json:"reduce_bytes"`
	// Offloaded is the float32 master weights and AdamW moments that models[].optim.offload: cpu
	// keeps in host memory for a model on another device (its partition under dist.shard), and
	// OffloadStep the host scratch of its AdamW step (the gradient copied over and the temporaries):
	// a model's figures, which the host ("cpu") device's figures add up.
	Offloaded   int64 `json:"offloaded_bytes"`
	OffloadStep int64 `json:"offload_step_bytes"`
	// Under dist.shard parameters (pkg/plan/units.go): Gathered is the update's units in flight (the
	// root and one layer whole, with their gradient buffers, and the collective's flat copy of one
	// layer), RolloutGathered the rollout's gathered weights (one unit at a time, or every model
	// whole under dist.rollout_gather: model), and Load a whole model as it loads, before it is cut
	// into shards (the device's load phase: every model's shards and the largest whole model).
	Gathered        int64 `json:"gathered_units_bytes"`
	RolloutGathered int64 `json:"rollout_gathered_bytes"`
	Load            int64 `json:"load_bytes"`
	// Ahead is the host memory of the rollouts generated ahead of training (rollout.max_staleness K):
	// K rollouts' calls, heldTokenBytes per prompt and response token; the host ("cpu") device's.
	Ahead int64 `json:"rollouts_ahead_bytes"`
	// The C heap (CPU tensors up to HeapBlockMax; larger ones are mapped and given back when freed)
	// keeps what it served after a phase ends, resident, until pkg/torch.ReleaseMemory trims it
	// after the update: UpdateHeap is what of the update's activations, attention and logits it
	// serves, KVHeap and DecodeHeap what of the rollout's KV cache and decoding layout; Held their
	// sum (blocks of one phase do not fit the other's tensors: see heldPhases). StepMapped is the
	// optimizer step's scratch when mapped (its largest parameter's float32 copies past
	// HeapBlockMax), which lands on top of the held heap; else 0.
	UpdateHeap int64 `json:"update_heap_bytes"`
	KVHeap     int64 `json:"rollout_kv_heap_bytes"`
	DecodeHeap int64 `json:"decode_copy_heap_bytes"`
	Held       int64 `json:"heap_held_bytes"`
	StepMapped int64 `json:"optimizer_step_mapped_bytes"`
	Update     int64 `json:"update_bytes"`           // max(Activations + Attention + Logits, Held + StepOnHeld, OptimStep) + Reduce
	Rollout    int64 `json:"rollout_bytes"`          // RolloutKV + DecodeCopy
	Static     int64 `json:"static_bytes"`           // Weights + Master + Gradients + Optimizer + Reference + Offloaded + Ahead
	Overhead   int64 `json:"runtime_overhead_bytes"` // device: the runtime's own memory
}

// Device is what one device holds at its peak: the models' static memory, plus the larger of the
// training update (one model at a time) and the rollout (one Generate call at a time, with every
// local model's decoding layout), plus the runtime.
type Device struct {
	Device string   `json:"device"`
	Models []string `json:"models"`
	Ranks  int      `json:"ranks"` // processes whose memory the device holds (CPU: --nproc)
	Parts
	// HeldPhase is the largest phase over the held heap (heap_held_bytes + that phase's mapped
	// tensors; 0 on CUDA): the peak is static + max(update, rollout, HeldPhase) + runtime.
	HeldPhase      int64  `json:"held_phase_bytes"`
	PeakBytes      int64  `json:"peak_bytes"`
	CapacityBytes  int64  `json:"capacity_bytes"`  // 0: unknown
	CapacitySource string `json:"capacity_source"` // how the capacity was found
	Fits           *bool  `json:"fits"`            // nil: the capacity is unknown
	// Fix, when the plan does not fit, is the smallest change of config keys that makes it fit, if
	// the plan found one (see fix): FixSets as --set arguments, Fix as text with the peak it gives.
	// Alternatives are other changes of the same size that fit.
	Fix          string   `json:"fix,omitempty"`
	FixSets      []string `json:"fix_sets,omitempty"`
	FixPeak      int64    `json:"fix_peak_bytes,omitempty"`
	Alternatives []string `json:"fix_alternatives,omitempty"`
}

// Build works out the plan of cfg. It reads each model's config.json (models[].path) or its
// `init:` section with its tokenizer's size; for a toy task it measures the longest prompt by
// playing the orchestra with a format-following stand-in policy (toy.go). It neither loads weights
// nor asks a device for its memory (see Capacities).
func Build(cfg *config.Config, opt Options) (*Plan, error) {
	pl := &Plan{WorldSize: max(opt.WorldSize, 1), Shard: cfg.Dist.Shard, Prompts: opt.Prompts}
	for _, p := range opt.Prompts {
		if !cfg.Data.FilterOverlongPrompts {
			pl.promptFloor = max(pl.promptFloor, int64(p.FirstTurn))
		}
	}
	var errs []error
	prompts, note, err := toyPrompts(cfg)
	if err != nil {
		errs = append(errs, err)
	}
	if note != "" {
		pl.Notes = append(pl.Notes, note)
	}
	if prompts == nil && cfg.Data.MaxPromptLength <= 0 {
		for _, p := range opt.Prompts {
			if p.Bound > 0 && p.Index >= 0 && p.Index < len(cfg.Agents) && cfg.Agents[p.Index].Name == p.Agent {
				if prompts == nil {
					prompts = map[int]int{}
				}
				prompts[p.Index] = p.Bound
			}
		}
	}
	for i, mc := range cfg.Models {
		m, err := buildModel(cfg, i, mc, opt, prompts)
		if err != nil {
			errs = append(errs, fmt.Errorf("models[%d] (%s): %w", i, mc.ID, err))
			continue
		}
		pl.Models = append(pl.Models, m)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	pl.group(opt, rolloutsAhead(cfg, pl.Models))
	for _, m := range pl.Models {
		if m.PromptBound == boundContext {
			pl.Notes = append(pl.Notes, fmt.Sprintf("models[%d] (%s): prompts bounded only by the context (%d tokens): set data.max_prompt_length for a tighter plan", m.Index, m.ID, m.PromptTokens+m.ResponseTokens))
		}
	}
	return pl, nil
}

// Where a model's prompt bound comes from.
const (
	boundKey     = "data.max_prompt_length"
	boundToy     = "toy prompts, measured"
	boundData    = "data's prompts, measured (first turn + later turns)"
	boundContext = "max_position_embeddings - max_new_tokens"
)

func buildModel(cfg *config.Config, i int, mc model.Config, opt Options, measured map[int]int) (Model, error) {
	adapter, frozen := mc.IsAdapter(), cfg.IsFrozenBase(mc.ID)
	mc = cfg.WeightsOf(mc) // an adapter runs with its base's architecture, dtype and device
	pc, err := modelConfig(mc)
	if err != nil {
		return Model{}, err
	}
	dt, err := arch.ParseDType(mc.DType)
	if err != nil {
		return Model{}, fmt.Errorf("dtype: %w", err)
	}
	e := int64(dt.Size())
	dev := mc.Device
	if dev == "" {
		dev = opt.Device
	}
	dev, err = deviceName(dev, opt.CUDA)
	if err != nil {
		return Model{}, err
	}
	m := Model{ID: mc.ID, Index: i, Device: dev, DType: dt.String(), GradientCheckpointing: mc.GradientCheckpointing}
	m.Params, err = arch.ParamCount(pc)
	if err != nil {
		return Model{}, err
	}
	in := input{cfg: pc, e: e, master: dt != arch.Float32, checkpointing: mc.GradientCheckpointing,
		cpu: dev == "cpu", world: opt.WorldSize, shard: cfg.Dist.Shard, offload: mc.Optim.Offload == "cpu", frozen: frozen,
		gatherWhole: cfg.Dist.RolloutGather == "model",
		budget:      int64(cmp.Or(mc.MaxTokensPerMicroBatch, cfg.Algorithm.MaxTokensPerMicroBatch))}
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
		if in.lora, err = arch.LoRAShapes(pc, mc.LoRA.Rank, mc.LoRA.TargetModules); err != nil {
			return Model{}, err
		}
		m.Params, m.Base = 0, mc.Base
		for _, n := range in.lora {
			m.Params += n
		}
		m.Role = fmt.Sprintf("LoRA adapter on %s (rank %d): its A and B with gradients, AdamW state and masters; activations of the base's forward", mc.Base, mc.LoRA.Rank)
	}
	m.keys = append(m.keys, fmt.Sprintf("models[%d].gradient_checkpointing", i))
	if !mc.GradientCheckpointing {
		m.keys[0] += " (false)"
	}
	al := cfg.Algorithm
	local := mc.Rollout.Engine == "" || mc.Rollout.Engine == "local"
	microKey := false
	for j, a := range cfg.Agents {
		if !slices.Contains(users, a.Model) {
			continue
		}
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
		prompt, bound := 0, ""
		switch n, ok := measured[j]; {
		case cfg.Data.MaxPromptLength > 0:
			prompt, bound = cfg.Data.MaxPromptLength, boundKey
		case ok && cfg.IsToy():
			prompt, bound = n, boundToy
		case ok:
			// No longer than the context allows: a later turn past it would fail the run anyway.
			prompt, bound = min(n, max(pc.MaxPositionEmbeddings-resp, 1)), boundData
		default:
			prompt, bound = max(pc.MaxPositionEmbeddings-resp, 1), boundContext
		}
		if t := int64(prompt + resp); t > in.t || (t == in.t && bound == boundKey) {
			in.t, m.PromptTokens, m.ResponseTokens, m.PromptBound = t, prompt, resp, bound
		}
		in.r = max(in.r, int64(resp))
		in.p = max(in.p, int64(prompt))
		in.agents = append(in.agents, j)
		if local && !adapter { // an adapter's rollout runs on its base's line
			in.rows = max(in.rows, rolloutRows(cfg))
			in.batch, in.group, in.valRows = int64(cfg.Algorithm.BatchSize), int64(cfg.Algorithm.GroupSize), valRows(cfg)
		}
	}
	if in.t == 0 {
		return Model{}, errors.New("no agent uses this model")
	}
	agents := 0
	for _, a := range cfg.Agents {
		if slices.Contains(users, a.Model) {
			agents++
		}
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
	m.keys = append(m.keys, fmt.Sprintf("models[%d].device (%s)", i, dev))
	m.MicroBatch, m.RolloutRows = int(in.b), int(in.rows)
	if err := in.checkSizes(i); err != nil { // before share's int64 products can wrap around
		return Model{}, err
	}
	m.in = in
	m.Parts = in.share()
	return m, nil
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
func rolloutRows(cfg *config.Config) int64 {
	return max(int64(cfg.Algorithm.BatchSize*cfg.Algorithm.GroupSize), valRows(cfg))
}

// valRows is the largest Generate call of validation (0 without validation).
func valRows(cfg *config.Config) int64 {
	var rows int64
	if cfg.Run.TestFreq > 0 && (len(cfg.Data.Val) > 0 || cfg.IsToy()) {
		q := EvalQuestions
		if cfg.Run.ValLimit > 0 {
			q = min(q, cfg.Run.ValLimit)
		}
		if cfg.IsToy() && cfg.Toy.Val > 0 {
			q = min(q, cfg.Toy.Val)
		}
		rows = int64(q * max(cfg.Run.ValK, 1))
	}
	return rows
}

// modelConfig reads a model's config.json, or builds the config of a randomly initialised model as
// pkg/train/setup.go's initConfig does (vocab_size 0 = its tokenizer's size).
func modelConfig(mc model.Config) (arch.Config, error) {
	if mc.Path != "" {
		return arch.ReadConfig(filepath.Join(mc.Path, "config.json"))
	}
	in := mc.Init
	vocab := in.VocabSize
	if vocab == 0 {
		tok, err := tokenizer.Load(mc.Tokenizer)
		if err != nil {
			return arch.Config{}, fmt.Errorf("tokenizer (for init's vocab_size): %w", err)
		}
		vocab = tok.VocabSize()
	}
	inter := in.IntermediateSize
	if inter == 0 {
		inter = 4 * in.HiddenSize
	}
	kv := in.NumKeyValueHeads
	if kv == 0 {
		kv = in.NumAttentionHeads
	}
	raw, err := json.Marshal(map[string]any{
		"model_type": in.ModelType, "hidden_size": in.HiddenSize, "intermediate_size": inter,
		"num_hidden_layers": in.NumHiddenLayers, "num_attention_heads": in.NumAttentionHeads,
		"num_key_value_heads": kv, "vocab_size": vocab, "rope_theta": in.RopeTheta,
		"tie_word_embeddings": in.TieWordEmbeddings, "max_position_embeddings": in.MaxPosition,
		"initializer_range": in.InitializerRange,
	})
	if err != nil {
		return arch.Config{}, err
	}
	c, err := arch.ParseConfig(raw)
	if err != nil {
		return arch.Config{}, fmt.Errorf("init: %w", err)
	}
	return c, nil
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

// group sums the models into devices; the host ("cpu") also holds ahead, the rollouts generated
// ahead of training.
func (pl *Plan) group(opt Options, ahead int64) {
	byDev := map[string]*Device{}
	for _, m := range pl.Models {
		d := byDev[m.Device]
		if d == nil {
			d = &Device{Device: m.Device, Ranks: 1}
			if m.Device == "cpu" && opt.HostRanks > 1 {
				d.Ranks = opt.HostRanks
			}
			byDev[m.Device] = d
			pl.Devices = append(pl.Devices, *d)
		}
		d.Models = append(d.Models, m.ID)
	}
	// Offloaded optimizer state lives in host memory: the "cpu" device holds it, whether or not a
	// model runs there.
	for _, m := range pl.Models {
		if m.Offloaded == 0 {
			continue
		}
		d := byDev["cpu"]
		if d == nil {
			d = &Device{Device: "cpu", Ranks: max(opt.HostRanks, 1)}
			byDev["cpu"] = d
			pl.Devices = append(pl.Devices, *d)
		}
		d.Models = append(d.Models, m.ID+" (offloaded optimizer)")
	}
	if ahead > 0 && byDev["cpu"] == nil {
		d := &Device{Device: "cpu", Ranks: max(opt.HostRanks, 1)}
		byDev["cpu"] = d
		pl.Devices = append(pl.Devices, *d)
	}
	for i := range pl.Devices {
		d := byDev[pl.Devices[i].Device]
		if d.Device == "cpu" && ahead > 0 {
			d.Models = append(d.Models, "rollouts ahead")
		}
		d.sum(pl.Models, ahead)
		pl.Devices[i] = *d
	}
	slices.SortFunc(pl.Devices, func(a, b Device) int { return strings.Compare(a.Device, b.Device) })
}

// phase names the device's peak: the update, the rollout, or one of them over the held heap (or,
// sharded, loading a model).
func (d Device) phase() string {
	h := d.heldPhases()
	if d.Load > d.Static+max(d.Update, d.Rollout, h) {
		return "load of a whole model, before it is cut into shards"
	}
	if h <= max(d.Update, d.Rollout) {
		if d.Rollout > d.Update {
			return "rollout"
		}
		return "update"
	}
	switch h - d.Held {
	case d.StepMapped + d.Reduce:
		return "optimizer step over the held heap"
	case d.RolloutKV - d.KVHeap + d.DecodeCopy - d.DecodeHeap + d.RolloutGathered:
		return "rollout over the held heap"
	}
	return "update over the held heap"
}

// sum works out the device's parts from its models: static memory adds up; the update phase is the
// largest model's (models are updated one after another, pkg/train/step.go); the rollout is the
// largest Generate call's KV cache (agents generate one after another, pkg/env/orchestra.go) with
// every local model's decoding layout. The host ("cpu") also holds the offloaded optimizer state of
// models on other devices, and their AdamW steps run there (one model's at a time, as updates).
func (d *Device) sum(models []Model, ahead int64) {
	var p Parts
	if d.Device == "cpu" {
		p.Ahead = ahead
	}
	var kv, load int64
	for _, m := range models {
		if m.Device != d.Device {
			if d.Device == "cpu" && m.Offloaded > 0 {
				p.Offloaded += m.Offloaded
				if m.OffloadStep > p.Update {
					p.Activations, p.Attention, p.Logits, p.Reduce = 0, 0, 0, 0
					p.OptimStep, p.Update = m.OffloadStep, m.OffloadStep
				}
			}
			continue
		}
		p.Weights += m.Weights
		p.Master += m.Master
		p.Gradients += m.Gradients
		p.Optimizer += m.Optimizer
		p.Reference += m.Reference
		p.DecodeCopy += m.DecodeCopy
		if m.Update > p.Update {
			p.Activations, p.Attention, p.Logits, p.OptimStep, p.Reduce, p.Update = m.Activations, m.Attention, m.Logits, m.OptimStep, m.Reduce, m.Update
			p.StepMapped, p.Gathered = m.StepMapped, m.Gathered
		}
		// Sharded weights: one model's units at a time in the rollout, or every model whole
		// (dist.rollout_gather: model: the rollout holds all of them); one model loads at a time.
		if m.in.gatherWhole {
			p.RolloutGathered += m.RolloutGathered
		} else {
			p.RolloutGathered = max(p.RolloutGathered, m.RolloutGathered)
		}
		load = max(load, m.Load)
		p.UpdateHeap = max(p.UpdateHeap, m.UpdateHeap) // the updates, one after another, reuse the heap
		p.DecodeHeap += m.DecodeHeap
		if m.RolloutKV > kv {
			p.KVHeap = m.KVHeap
		}
		kv = max(kv, m.RolloutKV)
	}
	p.RolloutKV = kv
	p.total()
	p.Overhead = CPUOverhead
	if d.Device != "cpu" {
		p.Overhead = CUDAOverhead
	}
	d.Parts = p
	d.HeldPhase = p.heldPhases()
	if load > 0 { // sharded weights: every model's shards and the whole model being cut
		p.Load = p.Weights + load
	}
	d.Parts = p
	d.PeakBytes = satMul(int64(d.Ranks), satSum(max(satSum(p.Static, max(p.Update, p.Rollout, d.HeldPhase)), p.Load), p.Overhead))
}
