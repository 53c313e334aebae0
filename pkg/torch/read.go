package torch

import (
	"fmt"
	"unsafe"

	"github.com/sugarme/gotch"
	lib "github.com/sugarme/gotch/libtch"
	"github.com/sugarme/gotch/ts"
)

// Element is a Go type a tensor's elements can be read into, and its dtype.
type Element interface {
	uint8 | int8 | int16 | int32 | int64 | float32 | float64
}

// Read copies the first len(dst) elements of t (any device and layout) into dst, whose element type
// must be t's dtype. It is gotch's CopyData without the check of every element by reflection
// (CopyData spends ~70 ns an element there: a second for 16M floats, where this is a memcpy).
func Read[T Element](t *ts.Tensor, dst []T) error {
	if len(dst) == 0 {
		return nil
	}
	if want := dtypeOf[T](); t.DType() != want {
		return fmt.Errorf("torch.Read: tensor of %v into a slice of %v", t.DType(), want)
	}
	if n := t.Numel(); uint(len(dst)) > n {
		return fmt.Errorf("torch.Read: %d elements wanted from a tensor of %d", len(dst), n)
	}
	lib.AtCopyData(lib.Ctensor(t.Ctensor()), unsafe.Pointer(unsafe.SliceData(dst)), uint(len(dst)), t.DType().Size())
	return ts.TorchErr()
}

// MustRead is Read, panicking on error (a programming error: the dtype or length is wrong).
func MustRead[T Element](t *ts.Tensor, dst []T) {
	if err := Read(t, dst); err != nil {
		panic(err)
	}
}

// Bytes copies a tensor's data (any dtype, device and layout) to the host as raw little-endian
// bytes, in its logical order: what a safetensors file or a checksum wants. (libtch's copy moves a
// device tensor to the host and makes a strided one contiguous itself, as Read relies on.)
func Bytes(t *ts.Tensor) ([]byte, error) {
	buf := make([]byte, t.Numel()*t.DType().Size())
	if len(buf) == 0 {
		return buf, nil
	}
	lib.AtCopyData(lib.Ctensor(t.Ctensor()), unsafe.Pointer(&buf[0]), t.Numel(), t.DType().Size())
	return buf, ts.TorchErr()
}

func dtypeOf[T Element]() gotch.DType {
	var z T
	switch any(z).(type) {
	case uint8:
		return gotch.Uint8
	case int8:
		return gotch.Int8
	case int16:
		return gotch.Int16
	case int32:
		return gotch.Int
	case int64:
		return gotch.Int64
	case float32:
		return gotch.Float
	case float64:
		return gotch.Double
	}
	panic(fmt.Sprintf("torch.Read: element type %T", z))
}
