//go:build drmas_overlay

// Added to gotch's libtch by scripts/torchsetup (see overlay.go), for libtorch @VERSION@.

package libtch

// The cgo side of drmas's c10d shim (drmas_c10d.h): libtorch's TCPStore and its Gloo and NCCL
// process groups. drmas uses it through pkg/dist only.

// #include <stdlib.h>
// #include "drmas_c10d.h"
import "C"

import (
	"errors"
	"time"
	"unsafe"
)

// Reduction operations of C10dGroup.AllReduce.
const (
	C10dSum = 0
	C10dMax = 1
	C10dMin = 2
)

// C10dNCCLBuilt reports whether this build includes ProcessGroupNCCL.
func C10dNCCLBuilt() bool { return C.drmas_nccl_built() != 0 }

// C10dGroup is one process group with its store.
type C10dGroup struct{ p *C.drmas_group }

func c10dError(msg *C.char) error {
	if msg == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(msg))
	return errors.New(C.GoString(msg))
}

// NewC10dGroup forms a group. The rank with serveStore serves the store at host:port (none when a
// launcher's agent serves it); a non-empty prefix puts the group's keys under "prefix/". timeout
// bounds the rendezvous and every collective.
func NewC10dGroup(backend, host string, port, rank, world int, timeout time.Duration, serveStore bool, prefix string) (*C10dGroup, error) {
	cb, ch, cp := C.CString(backend), C.CString(host), C.CString(prefix)
	defer C.free(unsafe.Pointer(cb))
	defer C.free(unsafe.Pointer(ch))
	defer C.free(unsafe.Pointer(cp))
	serve := 0
	if serveStore {
		serve = 1
	}
	var p *C.drmas_group
	if err := c10dError(C.drmas_group_new(cb, ch, C.int(port), C.int(rank), C.int(world), C.int64_t(timeout.Milliseconds()), C.int(serve), cp, &p)); err != nil {
		return nil, err
	}
	return &C10dGroup{p: p}, nil
}

// Close shuts the group down.
func (g *C10dGroup) Close() {
	if g.p != nil {
		C.drmas_group_free(g.p)
		g.p = nil
	}
}

// c10dArray copies tensor handles (torch::Tensor*, as gotch's Tensor.Ctensor returns) into C memory.
func c10dArray(ts []unsafe.Pointer) (*unsafe.Pointer, func()) {
	n := len(ts)
	if n == 0 {
		n = 1
	}
	arr := (*unsafe.Pointer)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	copy(unsafe.Slice(arr, n), ts)
	return arr, func() { C.free(unsafe.Pointer(arr)) }
}

// AllReduce reduces each tensor in place across the group.
func (g *C10dGroup) AllReduce(ts []unsafe.Pointer, op int) error {
	arr, free := c10dArray(ts)
	defer free()
	return c10dError(C.drmas_all_reduce(g.p, arr, C.int(len(ts)), C.int(op)))
}

// Broadcast copies each tensor from root to every rank.
func (g *C10dGroup) Broadcast(ts []unsafe.Pointer, root int) error {
	arr, free := c10dArray(ts)
	defer free()
	return c10dError(C.drmas_broadcast(g.p, arr, C.int(len(ts)), C.int(root)))
}

// AllGather fills outs (one tensor per rank, shaped like in) with every rank's in.
func (g *C10dGroup) AllGather(outs []unsafe.Pointer, in unsafe.Pointer) error {
	arr, free := c10dArray(outs)
	defer free()
	return c10dError(C.drmas_all_gather(g.p, arr, in))
}

// AllGatherBase gathers every rank's in into out (world × in's elements), in rank order: one flat
// collective (NCCL's all_gather_into_tensor; Gloo 1.13 refuses it).
func (g *C10dGroup) AllGatherBase(out, in unsafe.Pointer) error {
	return c10dError(C.drmas_all_gather_base(g.p, out, in))
}

// ReduceScatterBase reduces in (world × out's elements) over the ranks into this rank's part, out
// (NCCL's reduce_scatter_tensor; Gloo 1.13 refuses it).
func (g *C10dGroup) ReduceScatterBase(out, in unsafe.Pointer, op int) error {
	return c10dError(C.drmas_reduce_scatter_base(g.p, out, in, C.int(op)))
}

// Barrier waits for every rank.
func (g *C10dGroup) Barrier() error { return c10dError(C.drmas_barrier(g.p)) }

// StoreSet writes a key on the group's side connection to the store.
func (g *C10dGroup) StoreSet(key string, value []byte) error {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var p unsafe.Pointer
	if len(value) > 0 {
		p = C.CBytes(value)
		defer C.free(p)
	}
	return c10dError(C.drmas_store_set(g.p, ck, p, C.int64_t(len(value))))
}

// StoreGet reads a key, waiting up to timeout for it to be set.
func (g *C10dGroup) StoreGet(key string, timeout time.Duration) ([]byte, error) {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var p unsafe.Pointer
	var n C.int64_t
	if err := c10dError(C.drmas_store_get(g.p, ck, C.int64_t(timeout.Milliseconds()), &p, &n)); err != nil {
		return nil, err
	}
	defer C.free(p)
	return C.GoBytes(p, C.int(n)), nil
}
