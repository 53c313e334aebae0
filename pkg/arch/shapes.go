package arch

import (
	"fmt"
	"slices"
	"strings"
)

// WeightShape is one weight of a model as its checkpoint names it, without a tensor.
type WeightShape struct {
	Name  string  `json:"name"`
	Shape []int64 `json:"shape"`
}

// Numel is the number of elements of the weight.
func (w WeightShape) Numel() int64 {
	n := int64(1)
	for _, d := range w.Shape {
		n *= d
	}
	return n
}

// Shapes lists every weight a model of cfg holds (every expert of a mixture of experts) (a tied lm_head once), sorted by name as
// pkg/policy's Model.Parameters is, from the family's options alone: no tensor is allocated, so a
// folder holding only config.json is enough (the memory plan of pkg/plan reads it before anything
// loads). pkg/policy's tests check that its models hold exactly these tensors, for every family.
func Shapes(cfg Config) ([]WeightShape, error) {
	if lookup(cfg.ModelType) == nil {
		return nil, unknownFamily(cfg.ModelType)
	}
	o := OptionsOf(cfg)
	var out []WeightShape
	add := func(name string, shape ...int64) { out = append(out, WeightShape{Name: name, Shape: shape}) }
	linear := func(prefix string, in, outF int64, bias bool) {
		add(prefix+".weight", outF, in)
		if bias {
			add(prefix+".bias", outF)
		}
	}
	add("model.embed_tokens.weight", o.Vocab, o.Hidden)
	q, kv := o.Heads*o.HeadDim, o.KVHeads*o.HeadDim
	for i := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", o.Hidden)
		linear(p+"self_attn.q_proj", o.Hidden, q, o.QKVBias)
		linear(p+"self_attn.k_proj", o.Hidden, kv, o.QKVBias)
		linear(p+"self_attn.v_proj", o.Hidden, kv, o.QKVBias)
		linear(p+"self_attn.o_proj", q, o.Hidden, o.OBias)
		if o.QKNorm {
			add(p+"self_attn.q_norm.weight", o.HeadDim)
			add(p+"self_attn.k_norm.weight", o.HeadDim)
		}
		add(p+"post_attention_layernorm.weight", o.Hidden)
		if !o.MoE.SparseLayer(i) {
			linear(p+"mlp.gate_proj", o.Hidden, o.Inter, o.MLPBias)
			linear(p+"mlp.up_proj", o.Hidden, o.Inter, o.MLPBias)
			linear(p+"mlp.down_proj", o.Inter, o.Hidden, o.MLPBias)
			continue
		}
		linear(p+"mlp.gate", o.Hidden, o.MoE.Experts, false) // the router
		for j := range o.MoE.Experts {
			e := fmt.Sprintf("%smlp.experts.%d.", p, j)
			linear(e+"gate_proj", o.Hidden, o.MoE.Inter, false)
			linear(e+"up_proj", o.Hidden, o.MoE.Inter, false)
			linear(e+"down_proj", o.MoE.Inter, o.Hidden, false)
		}
	}
	add("model.norm.weight", o.Hidden)
	if !cfg.TieWordEmbeddings {
		add("lm_head.weight", o.Vocab, o.Hidden)
	}
	slices.SortFunc(out, func(a, b WeightShape) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ParamCount is the number of parameters of a model of cfg (the sum over Shapes).
func ParamCount(cfg Config) (int64, error) {
	ws, err := Shapes(cfg)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, w := range ws {
		n += w.Numel()
	}
	return n, nil
}

// ActiveInter is the width of the MLP activations one token of layer i makes: intermediate_size
// for a dense MLP; for a mixture of experts, num_experts_per_tok × moe_intermediate_size (the
// experts a token runs through; its router logits, num_experts of them, come on top). What a
// memory plan counts per token and layer where a dense model has intermediate_size.
func ActiveInter(cfg Config, i int) int64 {
	o := OptionsOf(cfg)
	if o.MoE.SparseLayer(i) {
		return o.MoE.TopK * o.MoE.Inter
	}
	return o.Inter
}

// MatmulParams is the elements of the decoder layers' weight matrices that one token is
// multiplied by (pkg/flops' N): q, k, v, o and the MLP of every layer, where a mixture of experts
// counts its router and the num_experts_per_tok experts a token runs through, not all of them.
// Embeddings, norms and biases are left out, and so is lm_head (taken on the scored tokens only).
func MatmulParams(cfg Config) int64 {
	o := OptionsOf(cfg)
	h, q, kv := o.Hidden, o.Heads*o.HeadDim, o.KVHeads*o.HeadDim
	var n int64
	for i := range cfg.NumHiddenLayers {
		n += 2*h*q + 2*h*kv
		if o.MoE.SparseLayer(i) {
			n += h*o.MoE.Experts + o.MoE.TopK*3*h*o.MoE.Inter
		} else {
			n += 3 * h * o.Inter
		}
	}
	return n
}

// ActiveParamCount is ParamCount with each sparse layer's experts counted num_experts_per_tok
// times instead of num_experts: the parameters one token's forward reads ("A3B" of Qwen3-30B-A3B),
// how a mixture of experts compares with a dense model of equal cost per token. A dense model's is
// its ParamCount.
func ActiveParamCount(cfg Config) (int64, error) {
	n, err := ParamCount(cfg)
	if err != nil {
		return 0, err
	}
	o := OptionsOf(cfg)
	idle := o.MoE.Experts - o.MoE.TopK // experts a token does not run through, per sparse layer
	return n - int64(o.MoE.SparseLayers())*idle*3*o.Hidden*o.MoE.Inter, nil
}
