package policy

import (
	"fmt"
	"maps"
	"slices"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
)

// The model families are pkg/arch's (config.json's model_type, one file each there): every one runs
// on the decoder block of decoder.go, shaped and switched by its arch.Options alone, so that a new
// family on that block needs nothing in this package. What the options name, this package
// implements: the activations, checked at init.

// options are arch.Options (the numbers and switches of a forward pass, computed once from
// config.json when a model is built) with the activation they name.
type options struct {
	arch.Options
	// act is the MLP's activation (Options.Act); it consumes its input.
	act func(*ts.Tensor) *ts.Tensor
}

// activations implements the MLP activations arch.Activations names.
var activations = map[string]func(*ts.Tensor) *ts.Tensor{
	arch.ActSiLU:     silu,
	arch.ActGELUTanh: func(x *ts.Tensor) *ts.Tensor { return x.MustGelu("tanh", true) },
	arch.ActGELU:     func(x *ts.Tensor) *ts.Tensor { return x.MustGelu("none", true) },
}

func init() {
	if got, want := slices.Sorted(maps.Keys(activations)), slices.Sorted(slices.Values(arch.Activations)); !slices.Equal(got, want) {
		panic(fmt.Sprintf("policy: activations implemented %v, pkg/arch names %v", got, want))
	}
}

// newOptions computes a model's options from c (its family's, see arch.OptionsOf).
func newOptions(c arch.Config) *options {
	o := arch.OptionsOf(c)
	return &options{Options: o, act: activations[o.Act]}
}
