package arch

import (
	"fmt"
	"strings"
)

// DType is a floating-point dtype a model's weights can have (pkg/policy maps it to libtorch's).
type DType int

// The dtypes config.json's torch_dtype and models[].dtype may name.
const (
	Float32 DType = iota
	BFloat16
	Float16
	Float64
)

// DTypeNames are the canonical names of the dtypes (what String writes), in order: what
// models[].dtype accepts (pkg/config).
func DTypeNames() []string {
	var out []string
	for d := Float32; d <= Float64; d++ {
		out = append(out, d.String())
	}
	return out
}

// ParseDType reads a dtype name as config.json and the command line write it.
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimPrefix(s, "torch.")) {
	case "float32", "float", "f32", "fp32":
		return Float32, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "float16", "half", "f16", "fp16":
		return Float16, nil
	case "float64", "double", "f64":
		return Float64, nil
	}
	return Float32, fmt.Errorf("dtype %q: want float32, bfloat16, float16 or float64", s)
}

// String is the config.json spelling of the dtype.
func (d DType) String() string {
	switch d {
	case BFloat16:
		return "bfloat16"
	case Float16:
		return "float16"
	case Float64:
		return "float64"
	default:
		return "float32"
	}
}

// Size is the number of bytes of one element.
func (d DType) Size() int {
	switch d {
	case BFloat16, Float16:
		return 2
	case Float64:
		return 8
	default:
		return 4
	}
}
