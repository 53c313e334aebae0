package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy/modeltype"
)

// families lists every model family this package runs: adding one is a file that defines its family
// value (see llama.go for the plain decoder, qwen3.go for options on it, gemma.go for a block of its
// own) and one line here.
var families = []*family{
	&llama,
	&qwen2,
	&qwen3,
	&mistral,
	&gemma,
}

// The families are exactly the model types pkg/policy/modeltype registers (pkg/config checks
// model_type against that list without building this package).
func init() { modeltype.Names.Covers(ModelTypes()) }

// family is one model architecture: what config.json's model_type names. Everything this package
// knows about an architecture lives in its family value, in the family's own file.
type family struct {
	modelType    string // config.json "model_type"
	architecture string // the transformers class config.json's "architectures" lists

	// defaults fills the keys config.json may omit with the values transformers' config class gives
	// them for this family. It runs before the defaults common to every family (see fillDefaults),
	// which only fill what is still unset. nil: the common ones are all.
	defaults func(c *Config)
	// check reports what in c this package cannot run, after the checks common to every family
	// (dimensions, dtype, rope scaling). nil: nothing more.
	check func(c Config) error
	// options adjusts what newOptions computed from config.json (biases, norms, windows …), once
	// per model. nil: nothing to adjust.
	options func(c Config, o *options)
	// layer builds decoder layer model.layers.N with the shapes o implies and no tensors yet.
	layer func(o *options) layer
	// norm builds the final norm (model.norm); nil: RMSNorm.
	norm func(o *options) norm
}

// options are the numbers and switches a forward pass needs, computed once from config.json (by
// newOptions and the family's options hook) when a model is built.
type options struct {
	hidden, inter, vocab    int64
	heads, kvHeads, headDim int64

	qkvBias, oBias, mlpBias bool // biases on q/k/v_proj, o_proj and the MLP projections
	qkNorm                  bool // RMSNorm of each query and key head before RoPE (q_norm, k_norm)
	// act is the MLP's activation (SiLU unless the family says otherwise); it consumes its input.
	act func(*ts.Tensor) *ts.Tensor

	// window is the sliding-window span of attention in tokens (a query at index i attends to keys
	// i−window+1 … i); 0: plain causal attention.
	window int64
	// embedScale multiplies the token embeddings (Gemma: √hidden); 0: no scaling.
	embedScale float64
}

// newOptions computes what every family shares from c; the family's options hook adjusts the rest.
func newOptions(c Config) *options {
	o := &options{
		hidden: int64(c.HiddenSize), inter: int64(c.IntermediateSize), vocab: int64(c.VocabSize),
		heads: int64(c.NumAttentionHeads), kvHeads: int64(c.NumKeyValueHeads), headDim: int64(c.HeadDim),
		qkvBias: c.AttentionBias, oBias: c.AttentionBias, act: silu,
	}
	if f := lookup(c.ModelType); f != nil && f.options != nil {
		f.options(c, o)
	}
	return o
}

// lookup finds the family of a model_type; nil when this package does not run it.
func lookup(modelType string) *family {
	for _, f := range families {
		if f.modelType == modelType {
			return f
		}
	}
	return nil
}

// ModelTypes lists the config.json model_type values this package runs, sorted.
func ModelTypes() []string {
	out := make([]string, len(families))
	for i, f := range families {
		out[i] = f.modelType
	}
	slices.Sort(out)
	return out
}

// unknownFamily is the error for a model_type no family claims.
func unknownFamily(modelType string) error {
	return fmt.Errorf("model_type %q: want one of %s", modelType, strings.Join(ModelTypes(), ", "))
}
