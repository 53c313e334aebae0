// drmas attention shim: libtorch's fused scaled_dot_product_attention for drmas's attention contract
// (pkg/policy/attention.go). Written into the patched gotch copy (package libtch) by scripts/torchsetup
// and compiled with the libtorch found there. Tensors are gotch's handles (torch::Tensor*). Every
// function that can fail returns NULL on success or an error message the caller frees with free().
//
// Why a shim and not gotch's generated atg_scaled_dot_product_attention: that wrapper hands libtorch
// an undefined tensor for an absent attention mask, which libtorch 2.x takes for a present mask and
// refuses ("Expected attn_mask dtype to be bool or float or to match query dtype"); it has no
// enable_gqa (libtorch 2.5); and it cannot tell a fused kernel from the math fallback, which holds
// the whole T × S score matrix.
#ifndef DRMAS_ATTENTION_SHIM_H
#define DRMAS_ATTENTION_SHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// drmas_sdpa_available reports whether this libtorch has scaled_dot_product_attention with a scale
// argument (2.1 and later).
int drmas_sdpa_available(void);

// drmas_sdpa computes softmax(q kᵀ · scale [+ causal mask]) v for q [B, H, T, D] and k, v [B, KV, S, D]
// (H a multiple of KV), with the causal mask aligned at the top left (query i sees keys 0 … i: use it
// for T == S). It runs only when libtorch picks a fused kernel (flash, memory-efficient, cuDNN) for
// these inputs: *out is the output [B, H, T, D] and *backend libtorch's choice (sdp::SDPBackend: 1
// flash, 2 efficient, 3 cuDNN …); when libtorch would fall back to its math kernel (which holds the
// T × S scores), *out is NULL, *backend 0 and nothing ran. Grouped-query heads go to the kernel as
// they are where libtorch supports it (enable_gqa, 2.5 and later) for a fused kernel; otherwise k and
// v are expanded to H heads (a copy of k and v, linear in S). Differentiable by autograd.
char *drmas_sdpa(void *q, void *k, void *v, int causal, double scale, void **out, int *backend);

// drmas_attend_rows is attention of one query per row whose rows are of different ages (a decoding
// step of a continuous batch): q [B, H, 1, D], k and v [slots, KV, S, D] (H a multiple of KV); row
// i's query, times scale (a 0-dim tensor), attends over the columns starts[i] … S−1 of slot slots[i]
// (slots NULL: slot i), from column S − window on when window > 0. Scores and softmax run in float32
// (float64 for float64 inputs). On the CPU in float32 a kernel of the shim's own runs (each key and
// value read once, no per-row dispatch), its (row, head) pairs spread over libtorch's OpenMP threads;
// elsewhere libtorch's matmul and softmax row by row, without a cgo crossing and a Go tensor per op
// (which cost 26 µs a row and layer here, most of a short row's cost). *out is the output
// [B, 1, H·D]. Gradients are not recorded.
char *drmas_attend_rows(void *q, void *k, void *v, void *scale, const int64_t *slots, const int64_t *starts,
                        int64_t window, void **out);

#ifdef __cplusplus
}
#endif

#endif
