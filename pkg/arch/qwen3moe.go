package arch

import (
	"errors"
	"fmt"
	"slices"
)

// Qwen3MoE is the model_type of the Qwen3 mixture-of-experts models (Qwen3-30B-A3B, Qwen3-235B-A22B).
const Qwen3MoE = "qwen3_moe"

// qwen3MoE is Qwen3's block (q/k norms, explicit head_dim) whose MLP is, in the sparse layers, a
// mixture of experts (transformers' Qwen3MoeSparseMoeBlock): a router mlp.gate (hidden →
// num_experts, no bias) whose float32 softmax picks each token's num_experts_per_tok experts
// (renormalized to sum to one when norm_topk_prob), each a SwiGLU MLP of moe_intermediate_size
// under mlp.experts.{j}. A layer is sparse unless mlp_only_layers lists it or (layer + 1) is not a
// multiple of decoder_sparse_step (or num_experts is 0); the others keep the dense MLP of
// intermediate_size. Keys config.json omits take configuration_qwen3_moe.py's defaults, written
// back when the model is saved. Sliding-window attention (use_sliding_window) is rejected.
var qwen3MoE = Family{
	ModelType:    Qwen3MoE,
	Architecture: "Qwen3MoeForCausalLM",
	Defaults: func(c *Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 32768
		}
		for _, d := range qwen3MoEDefaults {
			if !c.has(d.key) {
				c.SetRaw(d.key, d.value)
			}
		}
	},
	Check: func(c Config) error {
		_, err := qwen3MoEOf(c)
		return errors.Join(checkSiLU(c), noSlidingWindow(c), err)
	},
	Options: func(c Config, o *Options) {
		o.QKNorm = true
		o.MoE, _ = qwen3MoEOf(c)
	},
}

// qwen3MoEDefaults are configuration_qwen3_moe.py's defaults for the keys of the sparse MLP.
var qwen3MoEDefaults = []struct {
	key   string
	value any
}{
	{"num_experts", 128}, {"num_experts_per_tok", 8}, {"moe_intermediate_size", 768},
	{"decoder_sparse_step", 1}, {"norm_topk_prob", false}, {"mlp_only_layers", []int{}},
	{"router_aux_loss_coef", 0.001}, {"output_router_logits", false},
}

// qwen3MoEOf reads the sparse MLP's keys of a qwen3_moe config.json (defaults filled) and checks
// them; errors name the key.
func qwen3MoEOf(c Config) (MoE, error) {
	var m MoE
	var step int64 = 1
	var only []int
	var errs []error
	read := func(key string, dst any) {
		if _, err := c.Raw(key, dst); err != nil {
			errs = append(errs, err)
		}
	}
	read("num_experts", &m.Experts)
	read("num_experts_per_tok", &m.TopK)
	read("moe_intermediate_size", &m.Inter)
	read("decoder_sparse_step", &step)
	read("norm_topk_prob", &m.NormTopK)
	read("mlp_only_layers", &only)
	read("router_aux_loss_coef", &m.AuxLossCoef)
	read("output_router_logits", &m.OutputRouterLogits)
	if err := errors.Join(errs...); err != nil {
		return MoE{}, err
	}
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if m.Experts < 0 || m.Experts > int64(MaxSizes["num_experts"]) {
		bad("num_experts %d: want 0 – %d", m.Experts, MaxSizes["num_experts"])
	}
	if step < 1 {
		bad("decoder_sparse_step %d: want at least 1", step)
	}
	for _, l := range only {
		if l < 0 || l >= c.NumHiddenLayers {
			bad("mlp_only_layers: layer %d outside 0 – %d (num_hidden_layers %d)", l, c.NumHiddenLayers-1, c.NumHiddenLayers)
		}
	}
	if m.AuxLossCoef < 0 {
		bad("router_aux_loss_coef %g: want at least 0", m.AuxLossCoef)
	}
	if err := errors.Join(errs...); err != nil {
		return MoE{}, err
	}
	m.Sparse = make([]bool, max(c.NumHiddenLayers, 0))
	for i := range m.Sparse {
		m.Sparse[i] = m.Experts > 0 && (int64(i)+1)%step == 0 && !slices.Contains(only, i)
	}
	if m.SparseLayers() == 0 { // every layer dense: the experts' keys are not read (transformers builds none)
		return m, nil
	}
	if m.TopK < 1 || m.TopK > m.Experts {
		bad("num_experts_per_tok %d: want 1 – num_experts (%d)", m.TopK, m.Experts)
	}
	if m.Inter < 1 || m.Inter > int64(MaxSizes["moe_intermediate_size"]) {
		bad("moe_intermediate_size %d: want 1 – %d", m.Inter, MaxSizes["moe_intermediate_size"])
	}
	return m, errors.Join(errs...)
}
