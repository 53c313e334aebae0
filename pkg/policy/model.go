package policy

import (
	"fmt"
	"math"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// Model is a decoder language model of one of pkg/arch's registered families. Its weights
// are plain tensors named like the Hugging Face checkpoint: model.embed_tokens, the layers'
// hf-tagged fields under model.layers.N, model.norm and lm_head.
type Model struct {
	Config      arch.Config
	EmbedTokens *ts.Tensor // model.embed_tokens.weight [vocab, hidden]
	Layers      []layer    // model.layers.N
	Norm        norm       // model.norm
	LMHead      *ts.Tensor // lm_head.weight [vocab, hidden]; the same tensor as EmbedTokens when tied

	opts    *options    // computed once from arch.Config
	head    Linear      // lm_head as a layer (packed in the CPU decoding layout, see pack)
	dtype   gotch.DType // the weights' dtype
	compute gotch.DType // norms, softmax and logits: float32, or float64 for a float64 model
	device  gotch.Device
	rope    *rope
	eps     *ts.Tensor    // rms_norm_eps, a 0-dim tensor in the compute dtype
	scale   *ts.Tensor    // 1/sqrt(head_dim), a 0-dim tensor in the compute dtype
	embMul  *ts.Tensor    // options.embedScale as a 0-dim tensor in the weights' dtype; nil: none
	lora    *loraMix      // an adapted view's adapters (lora.go); nil: the plain model
	layout  [][]projShape // the layers' projections, as adapters store them (lora.go)
	hook    *unitHook     // the Units of sharded weights (units.go), shared with the model's views
}

// layer is one decoder block (model.layers.N) of a family. Its weights are its exported fields,
// tagged with the checkpoint names they load from (`hf:"self_attn"`): components such as Linear
// and RMSNorm, or structs of them. A nil pointer field is a weight the configuration does not have.
//
// A block is split around its attention, which the model runs itself (attention.go), so that
// training can take the attention's explicit backward and recompute a block (backprop.go):
// forwardLayer is finish(x, attention(qkv(x)), p).
type layer interface {
	// qkv maps the residual stream x [B, T, hidden] to the attention's inputs: q [B, heads, T,
	// head_dim] and k, v [B, kv_heads, T, head_dim], rotary embeddings applied.
	qkv(x *ts.Tensor, p *pass) (q, k, v *ts.Tensor)
	// finish maps x and the attention's output o [B, T, heads·head_dim] to the next stream.
	finish(x, o *ts.Tensor, p *pass) *ts.Tensor
	// packed returns the layer in the CPU decoding layout (see Model.pack), sharing its weights.
	packed() layer
}

// forwardLayer runs one block on the stream x.
func forwardLayer(l layer, x *ts.Tensor, p *pass) *ts.Tensor {
	q, k, v := l.qkv(x, p)
	if p.cache != nil {
		k, v = p.cache.append(p.layer, k, v) // [B, KV, S, D], views of the cache
	}
	var o *ts.Tensor
	if c := p.cache; c != nil && c.starts != nil && q.MustSize()[2] == 1 {
		o = attendRows(q, k, v, c.slots, c.starts, p.spec())
	} else if c != nil && c.from > 0 {
		o = attendFrom(q, k, v, c.from, p.spec())
	} else {
		o = attend(q, k, v, p.spec())
	}
	return l.finish(x, o, p)
}

// attendFrom is attend over the keys from column from on (no row sees the columns before it).
func attendFrom(q, k, v *ts.Tensor, from int64, sp *attnSpec) *ts.Tensor {
	n := k.MustSize()[2] - from
	k, v = k.MustNarrow(2, from, n, false), v.MustNarrow(2, from, n, false)
	sp.past -= from
	if sp.valid != nil {
		sp.valid = sp.valid.MustNarrow(1, from, n, false)
	}
	return attend(q, k, v, sp)
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
	past     int64      // keys already in the cache: the call's queries sit at past … past+T−1
	valid    *ts.Tensor // [B, past+T] bool: real keys (false: left padding); nil: all real
	cache    *KVCache   // nil: no cache
	layer    int        // the index of the running layer
	lora     *loraPass  // the rows' adapters (lora.go); nil: none
	seg      *segments  // packed rows (TrainScorePacked); nil: one sequence per row
	moe      *routing   // the call's routing record, replay and load-balancing sums (routing.go); nil: live routing alone
}

// spec is how the call's queries see the keys.
func (p *pass) spec() *attnSpec {
	return &attnSpec{past: p.past, window: p.m.opts.Window, valid: p.valid, scale: p.m.scale,
		scaleValue: 1 / math.Sqrt(float64(p.m.Config.HeadDim)), compute: p.m.compute, seg: p.seg}
}

// DType is the dtype of the weights; Device, where they live.
func (m *Model) DType() gotch.DType   { return m.dtype }
func (m *Model) Device() gotch.Device { return m.device }

// Forward runs the model on token ids [B, T] (int64) at positions [B, T] (int64; nil means
// cache.Len()…cache.Len()+T−1 for every row) and returns the logits [B, T, vocab], in float32
// (float64 for a float64 model).
//
// Attention is causal (and windowed, for a family with a sliding window). valid [B, S] (bool or
// integer, S = cache.Len() + T keys) marks the real keys: false or 0 for left padding, which no
// query attends to; nil means every key is real. With a cache, the new keys and values are
// appended to it (it must have room) and the queries also attend to what it already holds;
// without one, T tokens attend among themselves.
//
// Call it on the torch thread (inside torch.Do), inside a torch scope: what it returns belongs to
// that scope. Gradients are recorded when grad mode is on.
func (m *Model) Forward(ids, positions, valid *ts.Tensor, cache *KVCache) *ts.Tensor {
	defer m.forwardPass()()
	h := m.hidden(ids, positions, valid, cache, -1, nil)
	return m.logits(h)
}

// logits applies lm_head (with the rows' adapters' terms) and returns compute-dtype logits; h's
// first dimension is the batch rows.
func (m *Model) logits(h *ts.Tensor) *ts.Tensor { return m.logitsOf(h, nil) }

// logitsOf is logits for hidden states h [n, …, hidden] whose entries belong to the batch rows
// rows [n] (nil: the entries are the rows), for an adapted view whose adapters differ by row.
func (m *Model) logitsOf(h, rows *ts.Tensor) *ts.Tensor {
	out := m.head.forward(h)
	if m.lora.targets(projHead) {
		B := h.MustSize()[0]
		if rows != nil {
			B = int64(len(m.lora.rows))
		}
		if d := newLoraPass(m.lora, B, m.device).headDelta(h, rows); d != nil {
			out.MustAdd_(d) // in place: one logits-sized tensor fewer alive (lm_head's backward needs h, not out)
			d.MustDrop()
		}
	}
	if out.DType() != m.compute {
		out = out.MustTotype(m.compute, true)
	}
	return out
}

// Hidden returns the final hidden states [B, T, hidden] (after the last norm), in the weights'
// dtype; Forward is lm_head applied to them. Same arguments and threading rules as Forward.
func (m *Model) Hidden(ids, positions, valid *ts.Tensor, cache *KVCache) *ts.Tensor {
	defer m.forwardPass()()
	return m.hidden(ids, positions, valid, cache, -1, nil)
}

// hidden is Hidden with a bound on the positions (negative: unknown, read them back) and the
// call's routing work (nil: live routing alone; see routing.go).
//
// Memory: each layer (and the final norm) runs in a step of its own (see step), so a no-grad
// forward holds about one layer's activations at a time. A sharded model's caller brackets it in a
// forward pass (forwardPass): each layer is gathered around its step.
func (m *Model) hidden(ids, positions, valid *ts.Tensor, cache *KVCache, maxPos int64, rt *routing) *ts.Tensor {
	p, x := m.embed(ids, positions, valid, cache, maxPos)
	p.moe = rt
	x = m.runLayers(x, p)
	if cache != nil {
		cache.length += int(ids.MustSize()[1])
	}
	return step(x, func(x *ts.Tensor) *ts.Tensor { return m.Norm.forward(x, p) })
}

// embed starts a forward call: its pass (rotary tables, masks) and the token embeddings [B, T, hidden].
func (m *Model) embed(ids, positions, valid *ts.Tensor, cache *KVCache, maxPos int64) (*pass, *ts.Tensor) {
	size := ids.MustSize()
	if len(size) != 2 {
		panic(fmt.Sprintf("policy: Forward: ids have shape %v, want [B, T]", size))
	}
	B, T := size[0], size[1]
	past := int64(0)
	if cache != nil {
		past = int64(cache.Len())
		if cache.rows() != B || past+T > cache.capacity {
			panic(fmt.Sprintf("policy: Forward: %d×%d tokens do not fit a KV cache of batch %d holding %d of %d",
				B, T, cache.rows(), past, cache.capacity))
		}
	}
	if positions == nil {
		positions = ts.MustArange(ts.IntScalar(past+T), gotch.Int64, m.device).
			MustNarrow(0, past, T, true).MustUnsqueeze(0, true)
		maxPos = past + T - 1
	}
	if valid != nil && valid.DType() != gotch.Bool {
		valid = valid.MustNe(ts.IntScalar(0), false)
	}
	p := &pass{m: m, cache: cache, past: past, valid: valid, lora: newLoraPass(m.lora, B, m.device)}
	p.cos, p.sin = m.rope.lookup(m, positions, maxPos)
	x := ts.MustEmbedding(m.EmbedTokens, ids, -1, false, false)
	if d := p.lora.embedDelta(ids, x.DType()); d != nil {
		x = x.MustAdd(d, true)
	}
	if m.embMul != nil {
		x = x.MustMul(m.embMul, true)
	}
	return p, x
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

// Linear is y = x Wᵀ + b; Bias is nil when the layer has none. Its shape is fixed when the block is
// built from the model's options (see newLinear), before any tensor exists.
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
