//go:build drmas_overlay

// Added to gotch's ts by scripts/torchsetup (see overlay.go): the hooks pkg/torch's scopes use,
// called from newTensor and newScalar as addScopeHooks patches them (patch.go), and Scalar.Free.

package ts

import (
	"runtime"

	lib "github.com/sugarme/gotch/libtch"
)

// NewTensorHook, when set, is called with every tensor wrapper created (drmas uses it for scopes).
var NewTensorHook func(*Tensor)

// NewScalarHook, when set, is called with every scalar created (drmas's scopes free them on Close).
var NewScalarHook func(*Scalar)

// Free releases the scalar's C memory now (instead of at a later garbage collection); using the
// scalar afterwards is an error. A second Free does nothing.
func (sc *Scalar) Free() {
	if sc == nil || sc.cscalar == nil {
		return
	}
	runtime.SetFinalizer(sc, nil)
	lib.AtsFree(sc.cscalar)
	sc.cscalar = nil
}
