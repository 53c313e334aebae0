package policy

import (
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// Model is a Llama / Qwen2 / Qwen3 decoder. Its weights are plain tensors named like the Hugging
// Face checkpoint ("model.layers.0.self_attn.q_proj.weight" is Layers[0].SelfAttn.QProj.Weight).
type Model struct {
	Config      Config
	EmbedTokens *ts.Tensor // model.embed_tokens.weight [vocab, hidden]
	Layers      []*Layer   // model.layers.N
	Norm        RMSNorm    // model.norm
	LMHead      *ts.Tensor // lm_head.weight [vocab, hidden]; the same tensor as EmbedTokens when tied

	dtype   gotch.DType // the weights' dtype
	compute gotch.DType // norms, softmax and logits: float32, or float64 for a float64 model
	device  gotch.Device
	rope    *rope
	scale   *ts.Tensor // 1/sqrt(head_dim), a 0-dim tensor
}

// Layer is one decoder block (model.layers.N).
type Layer struct {
	InputLayernorm         RMSNorm   // input_layernorm
	SelfAttn               Attention // self_attn
	PostAttentionLayernorm RMSNorm   // post_attention_layernorm
	MLP                    MLP       // mlp
}

// Attention is grouped-query self-attention (self_attn).
type Attention struct {
	QProj, KProj, VProj, OProj Linear   // q_proj, k_proj, v_proj, o_proj
	QNorm, KNorm               *RMSNorm // q_norm, k_norm: Qwen3's per-head norms, nil otherwise
}

// MLP is the SiLU-gated feed-forward block (mlp): down(silu(gate(x)) * up(x)).
type MLP struct {
	GateProj, UpProj, DownProj Linear // gate_proj, up_proj, down_proj
}

// Linear is y = x Wᵀ + b; Bias is nil when the layer has none.
type Linear struct {
	Weight *ts.Tensor // [out, in]
	Bias   *ts.Tensor // [out] or nil
}

// RMSNorm is x / sqrt(mean(x²) + ε) · w, computed in float32 (float64 for float64 models) and cast
// back, as transformers does.
type RMSNorm struct {
	Weight *ts.Tensor
	eps    *ts.Tensor // 0-dim, compute dtype
}

// DType is the dtype of the weights; Device, where they live.
func (m *Model) DType() gotch.DType   { return m.dtype }
func (m *Model) Device() gotch.Device { return m.device }

// forward applies the layer.
func (l Linear) forward(x *ts.Tensor) *ts.Tensor {
	b := l.Bias
	if b == nil {
		b = ts.None
	}
	return ts.MustLinear(x, l.Weight, b)
}

func (n RMSNorm) forward(x *ts.Tensor, compute gotch.DType) *ts.Tensor {
	dt := x.DType()
	xf := x
	if dt != compute {
		xf = x.MustTotype(compute, false)
	}
	inv := xf.MustSquare(false).MustMeanDim([]int64{-1}, true, gotch.Invalid, true).MustAdd(n.eps, true).MustRsqrt(true)
	y := xf.MustMul(inv, false)
	inv.MustDrop()
	if xf != x {
		xf.MustDrop()
	}
	if dt != compute {
		y = y.MustTotype(dt, true)
	}
	out := n.Weight.MustMul(y, false)
	y.MustDrop()
	return out
}

func (f MLP) forward(x *ts.Tensor) *ts.Tensor {
	up := f.UpProj.forward(x)
	h := f.GateProj.forward(x).MustSilu(true).MustMul(up, true)
	up.MustDrop()
	out := f.DownProj.forward(h)
	h.MustDrop()
	return out
}

// Forward runs the model on token ids [B, T] (int64) at positions [B, T] (int64; nil means
// cache.Len()…cache.Len()+T−1 for every row) and returns the logits [B, T, vocab], in float32
// (float64 for a float64 model).
//
// mask is an additive attention bias broadcastable to [B, 1, T, S], S = cache.Len() + T keys: 0
// where a query may attend to a key and a large negative number where it may not, in the compute
// dtype (float32, or float64 for float64 models); CausalMask and PaddingMask build it. nil means
// plain causal attention. With a cache, the new keys and values are appended to it (it must have
// room) and the queries also attend to what it already holds; without one, T tokens attend among
// themselves.
//
// Call it on the torch thread (inside torch.Do), inside a torch scope: it frees nothing itself.
// Gradients are recorded when grad mode is on.
func (m *Model) Forward(ids, positions, mask *ts.Tensor, cache *KVCache) *ts.Tensor {
	h := m.Hidden(ids, positions, mask, cache)
	return m.logits(h, nil)
}

// logits applies lm_head (from pk when given) and returns compute-dtype logits.
func (m *Model) logits(h *ts.Tensor, pk *packed) *ts.Tensor {
	var out *ts.Tensor
	if pk != nil {
		out = h.MustMatmul(pk.head, false)
	} else {
		out = ts.MustLinear(h, m.LMHead, ts.None)
	}
	if out.DType() != m.compute {
		out = out.MustTotype(m.compute, true)
	}
	return out
}

// Hidden returns the final hidden states [B, T, hidden] (after the last norm), in the weights'
// dtype; Forward is lm_head applied to them. Same arguments and threading rules as Forward.
func (m *Model) Hidden(ids, positions, mask *ts.Tensor, cache *KVCache) *ts.Tensor {
	return m.hidden(ids, positions, mask, cache, -1, nil)
}

// hidden is Hidden with a bound on the positions (negative: unknown, read them back) and, for
// CPU decoding, the packed layout of the weights (nil: the checkpoint layout).
func (m *Model) hidden(ids, positions, mask *ts.Tensor, cache *KVCache, maxPos int64, pk *packed) *ts.Tensor {
	size := ids.MustSize()
	if len(size) != 2 {
		panic(fmt.Sprintf("policy: Forward: ids have shape %v, want [B, T]", size))
	}
	B, T := size[0], size[1]
	past := int64(0)
	if cache != nil {
		past = int64(cache.Len())
		if cache.batch != B || past+T > cache.capacity {
			panic(fmt.Sprintf("policy: Forward: %d×%d tokens do not fit a KV cache of batch %d holding %d of %d",
				B, T, cache.batch, past, cache.capacity))
		}
	}
	if positions == nil {
		positions = ts.MustArange(ts.IntScalar(past+T), gotch.Int64, m.device).
			MustNarrow(0, past, T, true).MustUnsqueeze(0, true)
		maxPos = past + T - 1
	}
	if mask == nil && T > 1 {
		mask = CausalMask(T, past, m.compute, m.device)
	}
	cos, sin := m.rope.lookup(m, positions, maxPos)
	x := ts.MustEmbedding(m.EmbedTokens, ids, -1, false, false)
	// Intermediates are dropped as soon as they are used (autograd keeps what it needs by itself),
	// which keeps the peak memory of a no-grad forward to about one layer's activations.
	for i, l := range m.Layers {
		var pl *packedLayer
		if pk != nil {
			pl = &pk.layers[i]
		}
		h := l.InputLayernorm.forward(x, m.compute)
		a := l.SelfAttn.forward(m, h, cos, sin, mask, cache, i, pl)
		h.MustDrop()
		x = x.MustAdd(a, true)
		a.MustDrop()
		h = l.PostAttentionLayernorm.forward(x, m.compute)
		var f *ts.Tensor
		if pl != nil {
			f = pl.mlp(h, int64(m.Config.IntermediateSize))
		} else {
			f = l.MLP.forward(h)
		}
		h.MustDrop()
		x = x.MustAdd(f, true)
		f.MustDrop()
	}
	if cache != nil {
		cache.length += int(T)
	}
	out := m.Norm.forward(x, m.compute)
	x.MustDrop()
	return out
}

// forward is HF's eager attention: q, k, v projections, (Qwen3) per-head norms, rotary embeddings,
// softmax(q kᵀ/√d + mask) v over grouped key/value heads, and the output projection.
func (a *Attention) forward(m *Model, x, cos, sin, mask *ts.Tensor, cache *KVCache, layer int, pl *packedLayer) *ts.Tensor {
	c := m.Config
	size := x.MustSize()
	B, T := size[0], size[1]
	H, KV, D := int64(c.NumAttentionHeads), int64(c.NumKeyValueHeads), int64(c.HeadDim)
	G := H / KV
	var q, k, v *ts.Tensor
	if pl != nil {
		qkv := pl.qkv.forward(x)
		q = qkv.MustNarrow(-1, 0, H*D, false).MustView([]int64{B, T, H, D}, true)
		k = qkv.MustNarrow(-1, H*D, KV*D, false).MustView([]int64{B, T, KV, D}, true)
		v = qkv.MustNarrow(-1, (H+KV)*D, KV*D, false).MustView([]int64{B, T, KV, D}, true)
		qkv.MustDrop()
	} else {
		q = a.QProj.forward(x).MustView([]int64{B, T, H, D}, true)
		k = a.KProj.forward(x).MustView([]int64{B, T, KV, D}, true)
		v = a.VProj.forward(x).MustView([]int64{B, T, KV, D}, true)
	}
	if a.QNorm != nil {
		q = replace(q, a.QNorm.forward(q, m.compute))
		k = replace(k, a.KNorm.forward(k, m.compute))
	}
	q = q.MustTranspose(1, 2, true) // [B, H, T, D]
	q = replace(q, applyRope(q, cos, sin))
	k = k.MustTranspose(1, 2, true) // [B, KV, T, D]
	k = replace(k, applyRope(k, cos, sin))
	v = v.MustTranspose(1, 2, true)
	if cache != nil {
		k, v = cache.append(layer, k, v) // [B, KV, S, D], views of the cache
	}
	S := k.MustSize()[2]
	// Query head h uses key/value head h/G: group the queries instead of repeating k and v.
	qg := q.MustReshape([]int64{B, KV, G * T, D}, true)
	kt := k.MustTranspose(2, 3, true)
	scores := qg.MustMatmul(kt, true).MustMul(m.scale, true).MustView([]int64{B, KV, G, T, S}, true)
	kt.MustDrop()
	if scores.DType() != m.compute {
		scores = scores.MustTotype(m.compute, true)
	}
	if mask != nil {
		m5 := mask.MustUnsqueeze(2, false)
		scores = scores.MustAdd(m5, true)
		m5.MustDrop()
	}
	probs := scores.MustSoftmax(-1, gotch.Invalid, true)
	if probs.DType() != m.dtype {
		probs = probs.MustTotype(m.dtype, true)
	}
	out := probs.MustView([]int64{B, KV, G * T, S}, true).MustMatmul(v, true) // [B, KV, G*T, D]
	v.MustDrop()
	out = out.MustView([]int64{B, H, T, D}, true).MustTranspose(1, 2, true).MustReshape([]int64{B, T, H * D}, true)
	var y *ts.Tensor
	if pl != nil {
		y = pl.o.forward(out)
	} else {
		y = a.OProj.forward(out)
	}
	out.MustDrop()
	return y
}

// replace drops old and returns new: for x = replace(x, f(x)).
func replace(old, new *ts.Tensor) *ts.Tensor {
	old.MustDrop()
	return new
}

// applyRope is q·cos + rotate_half(q)·sin with HF's rotate_half(x) = cat(−x₂, x₁); sin here
// already carries the sign (see rope), so rotate_half becomes a roll by half the head.
func applyRope(x, cos, sin *ts.Tensor) *ts.Tensor {
	d := x.MustSize()[3]
	r := x.MustRoll([]int64{d / 2}, []int64{-1}, false).MustMul(sin, true)
	return x.MustMul(cos, true).MustAdd(r, true)
}

// maskValue is what a forbidden query/key pair gets: finite, so that a fully masked row (a padding
// query) yields a harmless uniform distribution instead of NaN.
func maskValue(dt gotch.DType) float64 {
	if dt == gotch.Double {
		return -1e300
	}
	return -3.0e38
}

// CausalMask is the additive bias [1, 1, T, past+T] that lets query i (at absolute index past+i)
// attend to keys 0…past+i.
func CausalMask(T, past int64, dt gotch.DType, dev gotch.Device) *ts.Tensor {
	S := past + T
	allowed := ts.MustOnes([]int64{T, S}, gotch.Bool, dev).MustTril(past, true)
	zero := ts.MustZeros([]int64{1}, dt, dev)
	neg := ts.MustFull([]int64{1}, ts.FloatScalar(maskValue(dt)), dt, dev)
	return zero.MustWhereSelf(allowed, neg, true).MustView([]int64{1, 1, T, S}, true)
}

// PaddingMask combines the causal mask of T new queries after past cached keys with a key-validity
// mask valid [B, past+T] (bool or integer; true/1 for real tokens, false/0 for padding): the
// additive bias [B, 1, T, past+T] that Forward takes for left-padded batches.
func PaddingMask(valid *ts.Tensor, T, past int64, dt gotch.DType, dev gotch.Device) *ts.Tensor {
	S := past + T
	B := valid.MustSize()[0]
	allowed := ts.MustOnes([]int64{T, S}, gotch.Bool, dev).MustTril(past, true).MustView([]int64{1, 1, T, S}, true)
	keys := valid.MustNe(ts.IntScalar(0), false).MustView([]int64{B, 1, 1, S}, true)
	allowed = allowed.MustLogicalAnd(keys, true)
	zero := ts.MustZeros([]int64{1}, dt, dev)
	neg := ts.MustFull([]int64{1}, ts.FloatScalar(maskValue(dt)), dt, dev)
	return zero.MustWhereSelf(allowed, neg, true)
}
