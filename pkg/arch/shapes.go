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

// Shapes lists every weight a model of cfg holds (a tied lm_head once), sorted by name as
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
		linear(p+"mlp.gate_proj", o.Hidden, o.Inter, o.MLPBias)
		linear(p+"mlp.up_proj", o.Hidden, o.Inter, o.MLPBias)
		linear(p+"mlp.down_proj", o.Inter, o.Hidden, o.MLPBias)
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
