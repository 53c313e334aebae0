package policy

import (
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
)

// ParseDType reads a dtype name as config.json and the command line write it (arch.ParseDType), as
// libtorch's dtype.
func ParseDType(s string) (gotch.DType, error) {
	d, err := arch.ParseDType(s)
	if err != nil {
		return gotch.Invalid, err
	}
	return torchDType(d), nil
}

// DTypeName is the config.json spelling of a dtype (float32 for any dtype a model cannot have).
func DTypeName(d gotch.DType) string {
	switch d {
	case gotch.BFloat16:
		return arch.BFloat16.String()
	case gotch.Half:
		return arch.Float16.String()
	case gotch.Double:
		return arch.Float64.String()
	default:
		return arch.Float32.String()
	}
}

// torchDType is libtorch's dtype for d.
func torchDType(d arch.DType) gotch.DType {
	switch d {
	case arch.BFloat16:
		return gotch.BFloat16
	case arch.Float16:
		return gotch.Half
	case arch.Float64:
		return gotch.Double
	default:
		return gotch.Float
	}
}
