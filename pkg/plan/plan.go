package plan

import (
	"errors"
	"fmt"

	"github.com/drmas/drmas/pkg/config"
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
	pl.group(opt, rolloutsAhead(cfg.Rollout.MaxStaleness, cfg.Config, cfg.Algorithm, pl.Models))
	for _, m := range pl.Models {
		if m.PromptBound == boundContext {
			pl.Notes = append(pl.Notes, fmt.Sprintf("models[%d] (%s): prompts bounded only by the context (%d tokens): set data.max_prompt_length for a tighter plan", m.Index, m.ID, m.PromptTokens+m.ResponseTokens))
		}
	}
	return pl, nil
}
