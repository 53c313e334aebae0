package plan

import (
	"fmt"
	"math"

	"github.com/drmas/drmas/pkg/arch"
)

// MaxPartBytes bounds each part of a model's plan (its weights, their optimizer state, the
// activations of a micro-batch, the attention tiles, the logits chunk, the rollout KV cache): 32 PiB,
// five orders of magnitude beyond any device, and low enough that the plan's int64 sums of a model's
// parts and of a device's models cannot wrap around (before, a config needing about 10 EB wrapped to
// a plan of 17.4 GB that fit). A device's peak (× its ranks) saturates instead.
const MaxPartBytes = 1 << 55

// checkSizes works out the parts share computes, in float64 (which does not overflow), and refuses a
// model any part of which exceeds MaxPartBytes, naming the keys the part grows with.
func (in input) checkSizes(i int) error {
	c := in.cfg
	f := func(v int64) float64 { return float64(v) }
	var p float64 // parameters
	if in.lora != nil {
		for _, n := range in.lora {
			p += f(n)
		}
	} else {
		shapes, err := arch.Shapes(c)
		if err != nil {
			return err
		}
		for _, w := range shapes {
			n := 1.0
			for _, d := range w.Shape {
				n *= f(d)
			}
			p += n
		}
	}
	h, L, H, K, D, I, V := f(int64(c.HiddenSize)), f(int64(c.NumHiddenLayers)), f(int64(c.NumAttentionHeads)),
		f(int64(c.NumKeyValueHeads)), f(int64(c.HeadDim)), f(int64(c.IntermediateSize)), f(int64(c.VocabSize))
	e, b, t, r, rows := f(in.e), f(in.b), f(in.t), f(in.r), f(in.rows)
	micro := fmt.Sprintf("the micro-batch (%d: algorithm.micro_batch_size or agents[].train.micro_batch_size)", in.b)
	tokens := fmt.Sprintf("the sequence length (%d tokens: data.max_prompt_length + agents[].sampling.max_new_tokens)", in.t)
	shape := fmt.Sprintf("the model's config.json (models[%d])", i)
	parts := []struct {
		what  string
		bytes float64
		keys  string
	}{
		{"the weights with their gradients, AdamW state and master copy", p * (3*e + 12), shape},
		{"the activations of one micro-batch", (L + 2) * b * t * (ActHidden*h + ActIntermediate*I + ActAttention*(H+2*K)*D) * e,
			micro + ", " + tokens + " and " + shape},
		{"the attention scores of one micro-batch", attnCopies * b * H * t * t * 4, micro + ", " + tokens + " and " + shape},
		{"the logits of one micro-batch", b * r * V * 4 * logitsCopies, micro + ", agents[].sampling.max_new_tokens and " + shape},
		{"the rollout KV cache", 2 * L * K * D * e * t * rows,
			fmt.Sprintf("the rollout rows (%d: algorithm.batch_size × group_size, or run.val_k × the validation questions), %s and %s", in.rows, tokens, shape)},
	}
	for _, pt := range parts {
		// The attention tiles and the logits are chunked (arch.AttentionTileRows,
		// LogitsChunkTokens): what is held is far less than the product when the inputs are sane.
		switch pt.what {
		case "the attention scores of one micro-batch":
			if pt.bytes < math.MaxInt64/4 {
				pt.bytes = attnCopies * b * H * f(arch.AttentionTileRows(in.b, int64(c.NumAttentionHeads), in.t, in.t, !in.cpu)) * t * 4
			}
		case "the logits of one micro-batch":
			if b*r < math.MaxInt64/4 {
				pt.bytes = f(arch.LogitsChunkTokens(int64(c.VocabSize), in.b*in.r)) * V * 4 * logitsCopies
			}
		}
		if !(pt.bytes <= MaxPartBytes) {
			return fmt.Errorf("%s would take %.3g bytes, more than the %d (32 PiB) a plan counts: no device holds it; check %s",
				pt.what, pt.bytes, int64(MaxPartBytes), pt.keys)
		}
	}
	return nil
}

// satSum is the sum of vs, or math.MaxInt64 when it would not fit an int64 (the parts are ≥ 0).
func satSum(vs ...int64) int64 {
	var s int64
	for _, v := range vs {
		if v > math.MaxInt64-s {
			return math.MaxInt64
		}
		s += v
	}
	return s
}

// satMul is n·v, or math.MaxInt64 when it would not fit an int64 (n, v ≥ 0).
func satMul(n, v int64) int64 {
	if n != 0 && v > math.MaxInt64/n {
		return math.MaxInt64
	}
	return n * v
}
