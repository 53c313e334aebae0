package policy

import "github.com/sugarme/gotch/ts"

// decoderLayer is the pre-norm decoder block of Llama, Qwen2, Qwen3, Mistral, (with its own
// norms) Gemma and (with a mixture of experts for its MLP, moe.go) Qwen3-MoE:
//
//	x += o_proj(attention(qkv(input_layernorm(x))));  x += mlp(post_attention_layernorm(x))
//
// It is split around the attention (see layer): qkv gives the attention's inputs, finish the rest.
type decoderLayer struct {
	InputLayernorm         norm      `hf:"input_layernorm"`
	SelfAttn               attention `hf:"self_attn"`
	PostAttentionLayernorm norm      `hf:"post_attention_layernorm"`
	MLP                    ffn       `hf:"mlp"`
}

// ffn is a decoder layer's MLP: the gated MLP (mlp), or a mixture of experts (sparseMLP).
type ffn interface {
	forward(x *ts.Tensor, p *pass) *ts.Tensor
	// packed returns the MLP in the CPU decoding layout (see Model.pack), sharing its weights.
	packed() ffn
	// projections lists the MLP's projections an adapter may adapt, in the order it stores them
	// (after the attention's four: see decoderLayer.projections).
	projections() []projection
}

// newDecoderLayer is block i for o: norms, biases, q/k norms and the MLP's activation as o says,
// and a mixture of experts for its MLP where o.MoE makes the layer sparse.
func newDecoderLayer(o *options, i int) layer {
	l := &decoderLayer{
		InputLayernorm:         newNorm(o),
		SelfAttn:               newAttention(o),
		PostAttentionLayernorm: newNorm(o),
		MLP:                    newMLP(o, o.Inter, modMLP),
	}
	if o.MoE.SparseLayer(i) {
		l.MLP = newSparseMLP(o)
	}
	return l
}

// newNorm is a norm over the hidden size (the layers' and model.norm): Gemma's (1 + w) norm when o
// says so, else RMSNorm.
func newNorm(o *options) norm {
	if o.OffsetNorm {
		return &gemmaNorm{dim: o.Hidden}
	}
	return &RMSNorm{dim: o.Hidden}
}

func (l *decoderLayer) qkv(x *ts.Tensor, p *pass) (q, k, v *ts.Tensor) {
	return l.SelfAttn.qkv(l.InputLayernorm.forward(x, p), p)
}

func (l *decoderLayer) finish(x, o *ts.Tensor, p *pass) *ts.Tensor {
	x = x.MustAdd(addDelta(l.SelfAttn.OProj.forward(o), p, 3, o), false)
	return x.MustAdd(l.MLP.forward(l.PostAttentionLayernorm.forward(x, p), p), true)
}

func (l *decoderLayer) packed() layer {
	c := *l
	c.SelfAttn, c.MLP = l.SelfAttn.packed(), l.MLP.packed()
	return &c
}

// attention is grouped-query self-attention (self_attn): q, k, v projections, optional per-head
// RMSNorms of q and k (Qwen3), rotary embeddings, attention over grouped key/value heads
// (attention.go) and the output projection.
type attention struct {
	QProj    Linear   `hf:"q_proj"`
	KProj    Linear   `hf:"k_proj"`
	VProj    Linear   `hf:"v_proj"`
	OProj    Linear   `hf:"o_proj"`
	QNorm    *RMSNorm `hf:"q_norm"` // nil unless options.QKNorm
	KNorm    *RMSNorm `hf:"k_norm"`
	fusedQKV Linear   // q, k and v in one product: the CPU decoding layout (see pack); empty otherwise
	heads    int64
	kv       int64
	headD    int64
	groups   int64
}

func newAttention(o *options) attention {
	q, kv := o.Heads*o.HeadDim, o.KVHeads*o.HeadDim
	a := attention{
		QProj: newLinear(o.Hidden, q, o.QKVBias), KProj: newLinear(o.Hidden, kv, o.QKVBias),
		VProj: newLinear(o.Hidden, kv, o.QKVBias), OProj: newLinear(q, o.Hidden, o.OBias),
		heads: o.Heads, kv: o.KVHeads, headD: o.HeadDim, groups: o.Heads / o.KVHeads,
	}
	if o.QKNorm {
		a.QNorm, a.KNorm = &RMSNorm{dim: o.HeadDim}, &RMSNorm{dim: o.HeadDim}
	}
	return a
}

// project returns q, k and v [B, T, heads·head_dim] from x, in whichever layout the layer holds,
// with the low-rank terms of the call's adapters (lora.go) added.
func (a *attention) project(x *ts.Tensor, p *pass) (q, k, v *ts.Tensor) {
	if a.fusedQKV.wt == nil {
		q, k, v = a.QProj.forward(x), a.KProj.forward(x), a.VProj.forward(x)
	} else {
		qkv := a.fusedQKV.forward(x)
		H, KV := a.heads*a.headD, a.kv*a.headD
		q, k, v = qkv.MustNarrow(-1, 0, H, false), qkv.MustNarrow(-1, H, KV, false), qkv.MustNarrow(-1, H+KV, KV, false)
	}
	return addDelta(q, p, 0, x), addDelta(k, p, 1, x), addDelta(v, p, 2, x)
}

// qkv is the attention's input from the normed stream x [B, T, hidden]: q [B, heads, T, head_dim]
// and k, v [B, kv_heads, T, head_dim], with the q/k norms and rotary embeddings applied.
func (a *attention) qkv(x *ts.Tensor, p *pass) (q, k, v *ts.Tensor) {
	size := x.MustSize()
	B, T := size[0], size[1]
	H, KV, D := a.heads, a.kv, a.headD
	q, k, v = a.project(x, p)
	q = q.MustView([]int64{B, T, H, D}, true)
	k = k.MustView([]int64{B, T, KV, D}, true)
	v = v.MustView([]int64{B, T, KV, D}, true)
	if a.QNorm != nil {
		q, k = a.QNorm.forward(q, p), a.KNorm.forward(k, p)
	}
	q = applyRope(q.MustTranspose(1, 2, true), p.cos, p.sin) // [B, H, T, D]
	k = applyRope(k.MustTranspose(1, 2, true), p.cos, p.sin) // [B, KV, T, D]
	return q, k, v.MustTranspose(1, 2, true)
}

func (a attention) packed() attention {
	a.fusedQKV = packLinear(&a.QProj, &a.KProj, &a.VProj)
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

// mlp is the gated feed-forward block (mlp, and each expert of a mixture): down(act(gate(x)) ·
// up(x)), act from the options (SiLU, or Gemma's GELU).
type mlp struct {
	GateProj Linear `hf:"gate_proj"`
	UpProj   Linear `hf:"up_proj"`
	DownProj Linear `hf:"down_proj"`
	gateUp   Linear // gate and up in one product: the CPU decoding layout (see pack); empty otherwise
	act      func(*ts.Tensor) *ts.Tensor
	// mod is gate_proj's index among the layer's projections (decoderLayer.projections); up_proj
	// and down_proj follow it. An adapter's low-rank terms are found by it.
	mod int
}

// modMLP is the dense MLP's first projection: after q, k, v and o.
const modMLP = 4

// newMLP is a gated MLP of inter features whose gate_proj is the layer's projection mod.
func newMLP(o *options, inter int64, mod int) *mlp {
	return &mlp{GateProj: newLinear(o.Hidden, inter, o.MLPBias), UpProj: newLinear(o.Hidden, inter, o.MLPBias),
		DownProj: newLinear(inter, o.Hidden, o.MLPBias), act: o.act, mod: mod}
}

func (f *mlp) forward(x *ts.Tensor, p *pass) *ts.Tensor { return f.run(x, p, nil) }

// run is forward on x, whose entries (the tokens an expert runs, [n, hidden]) belong to the batch
// rows rows [n] for the rows' adapters; rows nil: x's first dimension is the rows.
func (f *mlp) run(x *ts.Tensor, p *pass, rows *ts.Tensor) *ts.Tensor {
	var gate, up *ts.Tensor
	if f.gateUp.wt == nil {
		gate, up = f.GateProj.forward(x), f.UpProj.forward(x)
	} else {
		gu := f.gateUp.forward(x)
		gate, up = gu.MustNarrow(-1, 0, f.GateProj.out, false), gu.MustNarrow(-1, f.GateProj.out, f.UpProj.out, false)
	}
	gate, up = addDeltaRows(gate, p, f.mod, x, rows), addDeltaRows(up, p, f.mod+1, x, rows)
	h := f.act(gate).MustMul(up, true)
	return addDeltaRows(f.DownProj.forward(h), p, f.mod+2, h, rows)
}

func (f *mlp) packed() ffn {
	c := *f
	c.gateUp = packLinear(&f.GateProj, &f.UpProj)
	c.DownProj = packLinear(&f.DownProj)
	return &c
}

// projections are gate_proj, up_proj and down_proj (under mlp., or mlp.experts.{j}. for an expert).
func (f *mlp) projections() []projection { return f.projectionsAt("mlp.") }

func (f *mlp) projectionsAt(prefix string) []projection {
	return []projection{
		{prefix + "gate_proj", targetGate, &f.GateProj},
		{prefix + "up_proj", targetGate + 1, &f.UpProj},
		{prefix + "down_proj", targetGate + 2, &f.DownProj},
	}
}

// silu is the SiLU activation; it consumes x (an activation frees its input).
func silu(x *ts.Tensor) *ts.Tensor { return x.MustSilu(true) }
