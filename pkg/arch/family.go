package arch

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/choice"
)

// families lists every model family drmas runs: adding one is a file that defines its Family value
// (see llama.go for the plain decoder, qwen3.go for options on it, gemma.go for its own norms and
// activation) and one line here. pkg/policy builds the block of every family from its Options
// alone, so a family on the shared decoder block needs nothing there.
var families = []*Family{
	&llama,
	&qwen2,
	&qwen3,
	&mistral,
	&gemma,
	&qwen3MoE,
}

// Names are the model_type values of the registered families, sorted (as errors list them):
// config.json's model_type and models[].init.model_type, which pkg/config checks against it.
var Names = newNames()

func newNames() *choice.Set { return choice.NewSet("model_type", ModelTypes()...) }

// AddFamilyForTest registers f as its line in families would, until remove is called: for the tests
// of the packages that run families (pkg/policy's forward pass, pkg/config, pkg/plan) showing that a
// new family needs nothing but its file and that line. Programs register their families in
// families; f's model_type must be new.
func AddFamilyForTest(f *Family) (remove func()) {
	if lookup(f.ModelType) != nil {
		panic("arch: model_type " + f.ModelType + " registered twice")
	}
	saved := families
	families = append(families[:len(families):len(families)], f)
	Names = newNames()
	return func() { families = saved; Names = newNames() }
}

// Family is one model architecture: what config.json's model_type names. Everything drmas knows
// about an architecture's configuration lives in its Family value, in the family's own file; the
// tensors of its block are pkg/policy's.
type Family struct {
	ModelType    string // config.json "model_type"
	Architecture string // the transformers class config.json's "architectures" lists

	// Defaults fills the keys config.json may omit with the values transformers' config class gives
	// them for this family. It runs before the defaults common to every family (see FillDefaults),
	// which only fill what is still unset. nil: the common ones are all.
	Defaults func(c *Config)
	// Check reports what in c drmas cannot run, after the checks common to every family
	// (dimensions, dtype, rope scaling). nil: nothing more.
	Check func(c Config) error
	// Options adjusts what OptionsOf computed from config.json (biases, norms, windows …). nil:
	// nothing to adjust.
	Options func(c Config, o *Options)
}

// Options are the numbers and switches of a model's forward pass, computed from config.json by
// OptionsOf and its family's Options hook: everything the block of pkg/policy and the shapes of
// Shapes depend on.
type Options struct {
	Hidden, Inter, Vocab    int64
	Heads, KVHeads, HeadDim int64

	QKVBias, OBias, MLPBias bool // biases on q/k/v_proj, o_proj and the MLP projections
	QKNorm                  bool // RMSNorm of each query and key head before RoPE (q_norm, k_norm)
	// OffsetNorm: every norm multiplies by (1 + w), its weight starting at zero (Gemma); else by w,
	// starting at one.
	OffsetNorm bool
	// Act is the MLP's activation, one of Activations.
	Act string

	// Window is the sliding-window span of attention in tokens (a query at index i attends to keys
	// i−window+1 … i); 0: plain causal attention.
	Window int64
	// EmbedScale multiplies the token embeddings (Gemma: √hidden); 0: no scaling.
	EmbedScale float64

	// MoE is the sparse MLP of a mixture-of-experts family (Qwen3-MoE); its zero value, a dense
	// model.
	MoE MoE
}

// MoE is the mixture-of-experts MLP of the sparse layers: a router (mlp.gate, hidden → Experts, no
// bias) whose softmax over the experts picks each token's TopK experts, SwiGLU MLPs of Inter
// features each (mlp.experts.{j}), whose outputs add up weighted by the picked probabilities
// (renormalized to sum to one when NormTopK). Layers that are not sparse keep the dense MLP.
type MoE struct {
	Experts  int64 // num_experts
	TopK     int64 // num_experts_per_tok
	Inter    int64 // moe_intermediate_size
	NormTopK bool  // norm_topk_prob
	// Sparse says, per decoder layer, whether its MLP is the mixture of experts.
	Sparse []bool
	// AuxLossCoef is router_aux_loss_coef, the weight transformers gives the router's
	// load-balancing loss in the training loss; OutputRouterLogits (output_router_logits) says
	// whether transformers adds it by default. The model only computes the loss (TrainScore); the
	// trainer decides whether to add it.
	AuxLossCoef        float64
	OutputRouterLogits bool
}

// SparseLayer says whether decoder layer i's MLP is the mixture of experts.
func (m MoE) SparseLayer(i int) bool { return i >= 0 && i < len(m.Sparse) && m.Sparse[i] }

// SparseLayers counts the layers whose MLP is the mixture of experts (0: a dense model).
func (m MoE) SparseLayers() int {
	n := 0
	for _, s := range m.Sparse {
		if s {
			n++
		}
	}
	return n
}

// Activations are the MLP activations a family's Options may name (pkg/policy implements exactly
// these): SiLU, and GELU exact or with the tanh approximation.
var Activations = []string{ActSiLU, ActGELUTanh, ActGELU}

// The activation names, as config.json spells them.
const (
	ActSiLU     = "silu"
	ActGELUTanh = "gelu_pytorch_tanh"
	ActGELU     = "gelu"
)

// OptionsOf computes what every family shares from c, then lets c's family adjust the rest.
func OptionsOf(c Config) Options {
	o := Options{
		Hidden: int64(c.HiddenSize), Inter: int64(c.IntermediateSize), Vocab: int64(c.VocabSize),
		Heads: int64(c.NumAttentionHeads), KVHeads: int64(c.NumKeyValueHeads), HeadDim: int64(c.HeadDim),
		QKVBias: c.AttentionBias, OBias: c.AttentionBias, Act: ActSiLU,
	}
	if f := lookup(c.ModelType); f != nil && f.Options != nil {
		f.Options(c, &o)
	}
	return o
}

// lookup finds the family of a model_type; nil when drmas does not run it.
func lookup(modelType string) *Family {
	for _, f := range families {
		if f.ModelType == modelType {
			return f
		}
	}
	return nil
}

// ModelTypes lists the config.json model_type values of the registered families, sorted.
func ModelTypes() []string {
	out := make([]string, len(families))
	for i, f := range families {
		out[i] = f.ModelType
	}
	slices.Sort(out)
	return out
}

// unknownFamily is the error for a model_type no family claims.
func unknownFamily(modelType string) error {
	return fmt.Errorf("model_type %q: want one of %s", modelType, strings.Join(ModelTypes(), ", "))
}

// checkSiLU is the check of the families whose MLP is SiLU-gated: hidden_act must say so.
func checkSiLU(c Config) error {
	if c.HiddenAct != ActSiLU {
		return fmt.Errorf("hidden_act %q: only silu is supported for %s", c.HiddenAct, c.ModelType)
	}
	return nil
}

// noSlidingWindow rejects use_sliding_window: true (Qwen2, Qwen3), which drmas does not run.
func noSlidingWindow(c Config) error {
	if v, ok := c.raw["use_sliding_window"]; ok && string(v) == "true" {
		return errors.New("use_sliding_window: sliding-window attention is not supported for " + c.ModelType)
	}
	return nil
}
