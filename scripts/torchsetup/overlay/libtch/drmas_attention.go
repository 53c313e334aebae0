//go:build drmas_overlay

// Added to gotch's libtch by scripts/torchsetup (see overlay.go and attention.go), for libtorch @VERSION@.

package libtch

// The cgo side of drmas's attention shim (drmas_attention.h). pkg/policy uses it.

// #include <stdlib.h>
// #include "drmas_attention.h"
import "C"

import (
	"errors"
	"unsafe"
)

// DrmasSDPAAvailable reports whether this libtorch has scaled_dot_product_attention (2.1 and later).
func DrmasSDPAAvailable() bool { return C.drmas_sdpa_available() != 0 }

// DrmasSDPA is libtorch's fused scaled_dot_product_attention of q [B, H, T, D] and k, v [B, KV, S, D]
// (causal: query i sees keys 0 … i), with no mask and no dropout. When libtorch would take its math
// kernel (which holds the T × S scores) nothing runs and ok is false. backend is libtorch's choice
// (sdp::SDPBackend: 1 flash, 2 memory-efficient, 3 cuDNN).
func DrmasSDPA(q, k, v Ctensor, causal bool, scale float64) (out Ctensor, backend int, ok bool, err error) {
	c := C.int(0)
	if causal {
		c = 1
	}
	var o unsafe.Pointer
	var b C.int
	if e := C.drmas_sdpa(unsafe.Pointer(q), unsafe.Pointer(k), unsafe.Pointer(v), c, C.double(scale), &o, &b); e != nil {
		msg := C.GoString(e)
		C.free(unsafe.Pointer(e))
		return nil, 0, false, errors.New(msg)
	}
	if o == nil {
		return nil, 0, false, nil
	}
	return Ctensor(o), int(b), true, nil
}

// DrmasAttendRows is attention of one query per row over rows of different ages in one KV cache
// (drmas_attend_rows): q [B, H, 1, D], k, v [slots, KV, S, D]; row i attends over the columns
// starts[i] … S−1 of slot slots[i] (slots nil: slot i), from S − window on when window > 0, its
// query times scale. The output is [B, 1, H·D].
func DrmasAttendRows(q, k, v, scale Ctensor, slots, starts []int64, window int64) (Ctensor, error) {
	var sp *C.int64_t
	if slots != nil {
		sp = (*C.int64_t)(unsafe.Pointer(&slots[0]))
	}
	var o unsafe.Pointer
	if e := C.drmas_attend_rows(unsafe.Pointer(q), unsafe.Pointer(k), unsafe.Pointer(v), unsafe.Pointer(scale), sp,
		(*C.int64_t)(unsafe.Pointer(&starts[0])), C.int64_t(window), &o); e != nil {
		msg := C.GoString(e)
		C.free(unsafe.Pointer(e))
		return nil, errors.New(msg)
	}
	return Ctensor(o), nil
}
