// Package flops counts a decoder model's floating-point operations per sequence, as MFU (model FLOPs
// utilization, verl's perf/mfu) takes them, and knows the peak throughput of common accelerators.
//
// Model FLOPs are what the model's mathematics needs, not what the kernels happen to do: a matmul of
// an [m, k] by a [k, n] matrix is 2·m·k·n; recomputation under gradient checkpointing, padding and
// elementwise work (norms, RoPE, SiLU, softmax) are not counted. A sequence of S tokens whose last R
// are the response (the tokens whose log-probs are taken) costs, forward:
//
//	2·N·S           the decoder layers' projections: N = L·(h·H·D + 2·h·K·D + H·D·h + 3·h·I)
//	                (q, k, v, o; gate, up, down), every token through every one
//	2·V·h·R         lm_head, on the response positions only (drmas computes logits there alone)
//	4·L·H·D·S²      attention: q·kᵀ and p·v over all S key positions, causal mask included (verl's
//	                convention, and what a dense kernel computes)
//
// A training pass (forward and backward) is three times that: the backward takes the gradients of
// both the inputs and the weights of every matmul (6·N per token, 12·L·H·D·S² for attention). A
// LoRA adapter's pass is twice the forward: the frozen base takes no weight gradients (the adapters'
// own products, r ≪ h, are left out). The log-prob passes (the old and the reference policy's,
// without grad) are one forward each.
package flops

import "github.com/drmas/drmas/pkg/arch"

// LayerParams is N: the elements of the decoder layers' projection matrices (q, k, v, o, gate, up,
// down), whose products every token pays for; a mixture-of-experts layer counts its router and the
// num_experts_per_tok experts a token runs through (arch.MatmulParams), not all of them. Embedding
// (a look-up), norms and biases are not in it, nor lm_head (Forward counts it on the response
// positions).
func LayerParams(c arch.Config) float64 { return float64(arch.MatmulParams(c)) }

// Forward is the FLOPs of one forward of a sequence of s tokens whose last r are scored.
func Forward(c arch.Config, s, r int) float64 {
	S, R := float64(s), float64(r)
	attn := 4 * float64(c.NumHiddenLayers) * float64(c.NumAttentionHeads*c.HeadDim) * S * S
	return 2*LayerParams(c)*S + 2*float64(c.VocabSize)*float64(c.HiddenSize)*R + attn
}

// Passes in units of a forward: a training pass (forward and backward), a LoRA adapter's training
// pass (no weight gradients for the frozen base), a log-prob pass.
const (
	TrainPass   = 3
	AdapterPass = 2
	LogProbPass = 1
)
