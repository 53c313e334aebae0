package policy

import (
	"errors"
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// decoderLayer is the pre-norm decoder block of Llama, Qwen2, Qwen3 and Mistral:
//
//	x += self_attn(input_layernorm(x));  x += mlp(post_attention_layernorm(x))
type decoderLayer struct {
	InputLayernorm         RMSNorm   `hf:"input_layernorm"`
	SelfAttn               attention `hf:"self_attn"`
	PostAttentionLayernorm RMSNorm   `hf:"post_attention_layernorm"`
	MLP                    mlp       `hf:"mlp"`
}

// newDecoderLayer is the standard block for o: biases, q/k norms and the MLP's activation as o says.
func newDecoderLayer(o *options) layer {
	return &decoderLayer{
		InputLayernorm:         RMSNorm{dim: o.hidden},
		SelfAttn:               newAttention(o),
		PostAttentionLayernorm: RMSNorm{dim: o.hidden},
		MLP:                    newMLP(o),
	}
}

func (l *decoderLayer) forward(x *ts.Tensor, p *pass) *ts.Tensor {
	x = x.MustAdd(l.SelfAttn.forward(l.InputLayernorm.forward(x, p), p), false)
	return x.MustAdd(l.MLP.forward(l.PostAttentionLayernorm.forward(x, p)), false)
}

func (l *decoderLayer) packed() layer {
	c := *l
	c.SelfAttn, c.MLP = l.SelfAttn.packed(), l.MLP.packed()
	return &c
}

// attention is grouped-query self-attention (self_attn), transformers' eager attention: q, k, v
// projections, optional per-head RMSNorms of q and k (Qwen3), rotary embeddings,
// softmax(q kᵀ/√d + mask) v over grouped key/value heads, and the output projection.
type attention struct {
	QProj  Linear   `hf:"q_proj"`
	KProj  Linear   `hf:"k_proj"`
	VProj  Linear   `hf:"v_proj"`
	OProj  Linear   `hf:"o_proj"`
	QNorm  *RMSNorm `hf:"q_norm"` // nil unless options.qkNorm
	KNorm  *RMSNorm `hf:"k_norm"`
	qkv    Linear   // q, k and v in one product: the CPU decoding layout (see pack); empty otherwise
	heads  int64
	kv     int64
	headD  int64
	groups int64
}

func newAttention(o *options) attention {
	q, kv := o.heads*o.headDim, o.kvHeads*o.headDim
	a := attention{
		QProj: newLinear(o.hidden, q, o.qkvBias), KProj: newLinear(o.hidden, kv, o.qkvBias),
		VProj: newLinear(o.hidden, kv, o.qkvBias), OProj: newLinear(q, o.hidden, o.oBias),
		heads: o.heads, kv: o.kvHeads, headD: o.headDim, groups: o.heads / o.kvHeads,
	}
	if o.qkNorm {
		a.QNorm, a.KNorm = &RMSNorm{dim: o.headDim}, &RMSNorm{dim: o.headDim}
	}
	return a
}

// project returns q, k and v [B, T, heads·head_dim] from x, in whichever layout the layer holds.
func (a *attention) project(x *ts.Tensor) (q, k, v *ts.Tensor) {
	if a.qkv.wt == nil {
		return a.QProj.forward(x), a.KProj.forward(x), a.VProj.forward(x)
	}
	qkv := a.qkv.forward(x)
	H, KV := a.heads*a.headD, a.kv*a.headD
	return qkv.MustNarrow(-1, 0, H, false), qkv.MustNarrow(-1, H, KV, false), qkv.MustNarrow(-1, H+KV, KV, false)
}

func (a *attention) forward(x *ts.Tensor, p *pass) *ts.Tensor {
	m := p.m
	size := x.MustSize()
	B, T := size[0], size[1]
	H, KV, D, G := a.heads, a.kv, a.headD, a.groups
	q, k, v := a.project(x)
	q = q.MustView([]int64{B, T, H, D}, true)
	k = k.MustView([]int64{B, T, KV, D}, true)
	v = v.MustView([]int64{B, T, KV, D}, true)
	if a.QNorm != nil {
		q, k = a.QNorm.forward(q, p), a.KNorm.forward(k, p)
	}
	q = applyRope(q.MustTranspose(1, 2, true), p.cos, p.sin) // [B, H, T, D]
	k = applyRope(k.MustTranspose(1, 2, true), p.cos, p.sin) // [B, KV, T, D]
	v = v.MustTranspose(1, 2, true)
	if p.cache != nil {
		k, v = p.cache.append(p.layer, k, v) // [B, KV, S, D], views of the cache
	}
	S := k.MustSize()[2]
	// Query head h uses key/value head h/G: group the queries instead of repeating k and v.
	qg := q.MustReshape([]int64{B, KV, G * T, D}, true)
	scores := qg.MustMatmul(k.MustTranspose(2, 3, false), true).MustMul(m.scale, true).MustView([]int64{B, KV, G, T, S}, true)
	if scores.DType() != m.compute {
		scores = scores.MustTotype(m.compute, true)
	}
	if p.mask != nil {
		scores = scores.MustAdd(p.mask.MustUnsqueeze(2, false), true)
	}
	probs := scores.MustSoftmax(-1, gotch.Invalid, true)
	if probs.DType() != m.dtype {
		probs = probs.MustTotype(m.dtype, true)
	}
	out := probs.MustView([]int64{B, KV, G * T, S}, true).MustMatmul(v, true) // [B, KV, G*T, D]
	out = out.MustView([]int64{B, H, T, D}, true).MustTranspose(1, 2, true).MustReshape([]int64{B, T, H * D}, true)
	return a.OProj.forward(out)
}

func (a attention) packed() attention {
	a.qkv = packLinear(&a.QProj, &a.KProj, &a.VProj)
	a.OProj = packLinear(&a.OProj)
	return a
}

// applyRope is q·cos + rotate_half(q)·sin with HF's rotate_half(x) = cat(−x₂, x₁); sin here
// already carries the sign (see rope), so rotate_half becomes a roll by half the head.
func applyRope(x, cos, sin *ts.Tensor) *ts.Tensor {
	d := x.MustSize()[3]
	r := x.MustRoll([]int64{d / 2}, []int64{-1}, false).MustMul(sin, true)
	return x.MustMul(cos, false).MustAdd(r, true)
}

// mlp is the gated feed-forward block (mlp): down(act(gate(x)) · up(x)), act from the options
// (SiLU, or Gemma's GELU).
type mlp struct {
	GateProj Linear `hf:"gate_proj"`
	UpProj   Linear `hf:"up_proj"`
	DownProj Linear `hf:"down_proj"`
	gateUp   Linear // gate and up in one product: the CPU decoding layout (see pack); empty otherwise
	act      func(*ts.Tensor) *ts.Tensor
}

func newMLP(o *options) mlp {
	return mlp{GateProj: newLinear(o.hidden, o.inter, o.mlpBias), UpProj: newLinear(o.hidden, o.inter, o.mlpBias),
		DownProj: newLinear(o.inter, o.hidden, o.mlpBias), act: o.act}
}

func (f *mlp) forward(x *ts.Tensor) *ts.Tensor {
	var gate, up *ts.Tensor
	if f.gateUp.wt == nil {
		gate, up = f.GateProj.forward(x), f.UpProj.forward(x)
	} else {
		gu := f.gateUp.forward(x)
		gate, up = gu.MustNarrow(-1, 0, f.GateProj.out, false), gu.MustNarrow(-1, f.GateProj.out, f.UpProj.out, false)
	}
	return f.DownProj.forward(f.act(gate).MustMul(up, true))
}

func (f mlp) packed() mlp {
	f.gateUp = packLinear(&f.GateProj, &f.UpProj)
	f.DownProj = packLinear(&f.DownProj)
	return f
}

// silu is the SiLU activation; it consumes x (an activation frees its input).
func silu(x *ts.Tensor) *ts.Tensor { return x.MustSilu(true) }

// checkSiLU is the check of the families whose MLP is SiLU-gated: hidden_act must say so.
func checkSiLU(c Config) error {
	if c.HiddenAct != "silu" {
		return fmt.Errorf("hidden_act %q: only silu is supported for %s", c.HiddenAct, c.ModelType)
	}
	return nil
}

// noSlidingWindow rejects use_sliding_window: true (Qwen2, Qwen3), which this package does not run.
func noSlidingWindow(c Config) error {
	if v, ok := c.raw["use_sliding_window"]; ok && string(v) == "true" {
		return errors.New("use_sliding_window: sliding-window attention is not supported for " + c.ModelType)
	}
	return nil
}
