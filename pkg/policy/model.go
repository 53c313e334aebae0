package policy

import (
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// Model is a decoder language model of one of the registered families (see families). Its weights
// are plain tensors named like the Hugging Face checkpoint: model.embed_tokens, the layers'
// hf-tagged fields under model.layers.N, model.norm and lm_head.
type Model struct {
	Config      Config
	EmbedTokens *ts.Tensor // model.embed_tokens.weight [vocab, hidden]
	Layers      []layer    // model.layers.N
	Norm        norm       // model.norm
	LMHead      *ts.Tensor // lm_head.weight [vocab, hidden]; the same tensor as EmbedTokens when tied

	opts    *options    // computed once from Config
	head    Linear      // lm_head as a layer (packed in the CPU decoding layout, see pack)
	dtype   gotch.DType // the weights' dtype
	compute gotch.DType // norms, softmax and logits: float32, or float64 for a float64 model
	device  gotch.Device
	rope    *rope
	eps     *ts.Tensor // rms_norm_eps, a 0-dim tensor in the compute dtype
	scale   *ts.Tensor // 1/sqrt(head_dim), a 0-dim tensor in the compute dtype
	embMul  *ts.Tensor // options.embedScale as a 0-dim tensor in the weights' dtype; nil: none
}

// layer is one decoder block (model.layers.N) of a family. Its weights are its exported fields,
// tagged with the checkpoint names they load from (`hf:"self_attn"`): components such as Linear
// and RMSNorm, or structs of them. A nil pointer field is a weight the configuration does not have.
type layer interface {
	// forward maps the residual stream x [B, T, hidden] to the next one.
	forward(x *ts.Tensor, p *pass) *ts.Tensor
	// packed returns the layer in the CPU decoding layout (see Model.pack), sharing its weights.
	packed() layer
}

// norm is a normalisation layer (model.norm, the layers' norms): a component with its weights.
type norm interface {
	weightLister
	forward(x *ts.Tensor, p *pass) *ts.Tensor
}

// pass is what the layers of one forward call share.
type pass struct {
	m        *Model
	cos, sin *ts.Tensor // rotary tables [B, 1, T, head_dim] for the positions of the call
	mask     *ts.Tensor // additive attention bias [B or 1, 1, T, S]; nil: none (one query per row)
	cache    *KVCache   // nil: no cache
	layer    int        // the index of the running layer
}

// DType is the dtype of the weights; Device, where they live.
func (m *Model) DType() gotch.DType   { return m.dtype }
func (m *Model) Device() gotch.Device { return m.device }

// Forward runs the model on token ids [B, T] (int64) at positions [B, T] (int64; nil means
// cache.Len()…cache.Len()+T−1 for every row) and returns the logits [B, T, vocab], in float32
// (float64 for a float64 model).
//
// mask is an additive attention bias broadcastable to [B, 1, T, S], S = cache.Len() + T keys: 0
// where a query may attend to a key and a large negative number where it may not, in the compute
// dtype (float32, or float64 for float64 models); CausalMask and PaddingMask build it. nil means
// plain causal attention. A family with sliding-window attention narrows whichever mask to its
// window by itself. With a cache, the new keys and values are appended to it (it must have room)
// and the queries also attend to what it already holds; without one, T tokens attend among
// themselves.
//
// Call it on the torch thread (inside torch.Do), inside a torch scope: what it returns belongs to
// that scope. Gradients are recorded when grad mode is on.
func (m *Model) Forward(ids, positions, mask *ts.Tensor, cache *KVCache) *ts.Tensor {
	h := m.Hidden(ids, positions, mask, cache)
	return m.logits(h)
}

// logits applies lm_head and returns compute-dtype logits.
func (m *Model) logits(h *ts.Tensor) *ts.Tensor {
	out := m.head.forward(h)
	if out.DType() != m.compute {
		out = out.MustTotype(m.compute, true)
	}
	return out
}

// Hidden returns the final hidden states [B, T, hidden] (after the last norm), in the weights'
// dtype; Forward is lm_head applied to them. Same arguments and threading rules as Forward.
func (m *Model) Hidden(ids, positions, mask *ts.Tensor, cache *KVCache) *ts.Tensor {
	return m.hidden(ids, positions, mask, cache, -1)
}

// hidden is Hidden with a bound on the positions (negative: unknown, read them back).
//
// Memory: each layer (and the final norm) runs in a step of its own (see step), so a no-grad
// forward holds about one layer's activations at a time.
func (m *Model) hidden(ids, positions, mask *ts.Tensor, cache *KVCache, maxPos int64) *ts.Tensor {
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
	p := &pass{m: m, cache: cache, mask: m.attentionMask(mask, T, past)}
	p.cos, p.sin = m.rope.lookup(m, positions, maxPos)
	x := ts.MustEmbedding(m.EmbedTokens, ids, -1, false, false)
	if m.embMul != nil {
		x = x.MustMul(m.embMul, true)
	}
	for i, l := range m.Layers {
		p.layer = i
		x = step(x, func(x *ts.Tensor) *ts.Tensor { return l.forward(x, p) })
	}
	if cache != nil {
		cache.length += int(T)
	}
	return step(x, func(x *ts.Tensor) *ts.Tensor { return m.Norm.forward(x, p) })
}

// step runs f on the stream x in a torch scope of its own: everything f makes is freed when it
// returns, except its result, and x, which the result replaces, is freed too (autograd keeps what
// backward needs by itself). This is the forward pass's one memory rule: layers free nothing by hand.
func step(x *ts.Tensor, f func(*ts.Tensor) *ts.Tensor) *ts.Tensor {
	s := torch.NewScope()
	defer s.Close()
	y := f(x)
	s.Keep(y)
	x.MustDrop()
	return y
}

// attentionMask is the bias the layers add to the attention scores: mask (causal when nil and
// T > 1), narrowed to the sliding window when the family has one shorter than the keys.
func (m *Model) attentionMask(mask *ts.Tensor, T, past int64) *ts.Tensor {
	w := m.opts.window
	if w > 0 && past+T > w {
		win := WindowMask(T, past, w, m.compute, m.device)
		if mask == nil {
			return win
		}
		// The smaller bias wins: both are 0 or the same large negative number, so a key masked
		// twice stays finite (an added pair would overflow to −inf and a fully masked row to NaN).
		return mask.MustMinimum(win, false)
	}
	if mask == nil && T > 1 {
		return CausalMask(T, past, m.compute, m.device)
	}
	return mask
}

// Linear is y = x Wᵀ + b; Bias is nil when the layer has none. Its shape is fixed when a family's
// constructor makes it (see newLinear), before any tensor exists.
type Linear struct {
	Weight *ts.Tensor // weight [out, in]
	Bias   *ts.Tensor // bias [out] or nil

	in, out int64
	bias    bool
	wt      *ts.Tensor // Wᵀ [in, out], contiguous: the CPU decoding layout (see pack); nil otherwise
}

// newLinear is a Linear of in → out features, with a bias or not.
func newLinear(in, out int64, bias bool) Linear { return Linear{in: in, out: out, bias: bias} }

func (l *Linear) weights(prefix string, out *[]slot) {
	*out = append(*out, slot{prefix + "weight", []int64{l.out, l.in}, initNormal, &l.Weight})
	if l.bias {
		*out = append(*out, slot{prefix + "bias", []int64{l.out}, initZeros, &l.Bias})
	}
}

// forward applies the layer, in whichever layout it holds.
func (l *Linear) forward(x *ts.Tensor) *ts.Tensor {
	if l.wt != nil {
		y := x.MustMatmul(l.wt, false)
		if l.Bias != nil {
			y = y.MustAdd(l.Bias, true)
		}
		return y
	}
	b := l.Bias
	if b == nil {
		b = ts.None
	}
	return ts.MustLinear(x, l.Weight, b)
}

// RMSNorm is x / sqrt(mean(x²) + ε) · w, computed in float32 (float64 for float64 models) and cast
// back before the multiplication by w, as transformers' LlamaRMSNorm does.
type RMSNorm struct {
	Weight *ts.Tensor // weight [dim]
	dim    int64
}

func (n *RMSNorm) weights(prefix string, out *[]slot) {
	*out = append(*out, slot{prefix + "weight", []int64{n.dim}, initOnes, &n.Weight})
}

func (n *RMSNorm) forward(x *ts.Tensor, p *pass) *ts.Tensor {
	return n.Weight.MustMul(cast(rms(x, p.m), x.DType()), false)
}

// rms is x / sqrt(mean(x²) + ε) over the last dimension, in the compute dtype.
func rms(x *ts.Tensor, m *Model) *ts.Tensor {
	xf := cast(x, m.compute)
	inv := xf.MustSquare(false).MustMeanDim([]int64{-1}, true, gotch.Invalid, true).MustAdd(m.eps, true).MustRsqrt(true)
	return xf.MustMul(inv, false)
}

// cast is x in dtype dt: x itself when it already is.
func cast(x *ts.Tensor, dt gotch.DType) *ts.Tensor {
	if x.DType() == dt {
		return x
	}
	return x.MustTotype(dt, false)
}

// replace drops old and returns new: for x = replace(x, f(x)).
func replace(old, new *ts.Tensor) *ts.Tensor {
	old.MustDrop()
	return new
}

// maskValue is what a forbidden query/key pair gets: finite, so that a fully masked row (a padding
// query) yields a harmless uniform distribution instead of NaN.
func maskValue(dt gotch.DType) float64 {
	if dt == gotch.Double {
		return -1e300
	}
	return -3.0e38
}

// bias turns a bool mask of allowed pairs into the additive bias: 0 where allowed, maskValue where not.
func bias(allowed *ts.Tensor, dt gotch.DType, dev gotch.Device) *ts.Tensor {
	zero := ts.MustZeros([]int64{1}, dt, dev)
	neg := ts.MustFull([]int64{1}, ts.FloatScalar(maskValue(dt)), dt, dev)
	return zero.MustWhereSelf(allowed, neg, true)
}

// CausalMask is the additive bias [1, 1, T, past+T] that lets query i (at absolute index past+i)
// attend to keys 0…past+i.
func CausalMask(T, past int64, dt gotch.DType, dev gotch.Device) *ts.Tensor {
	S := past + T
	allowed := ts.MustOnes([]int64{T, S}, gotch.Bool, dev).MustTril(past, true)
	return bias(allowed, dt, dev).MustView([]int64{1, 1, T, S}, true)
}

// WindowMask is the additive bias [1, 1, T, past+T] of causal sliding-window attention over window
// tokens: query i (at absolute index past+i) attends to keys past+i−window+1 … past+i, as
// transformers' sliding-window mask does (key index > query index − window).
func WindowMask(T, past, window int64, dt gotch.DType, dev gotch.Device) *ts.Tensor {
	S := past + T
	allowed := ts.MustOnes([]int64{T, S}, gotch.Bool, dev).MustTril(past, true).MustTriu(past-window+1, true)
	return bias(allowed, dt, dev).MustView([]int64{1, 1, T, S}, true)
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
	return bias(allowed, dt, dev)
}
