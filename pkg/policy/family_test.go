package policy

import (
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
)

// Config.NumParams (from the family's structure, without tensors) counts what Parameters holds.
func TestNumParamsMatchesParameters(t *testing.T) {
	for _, family := range arch.ModelTypes() {
		m := randomModel(t, family, 64, gotch.Float, 0.02, 1)
		var n int64
		for _, p := range m.Parameters() {
			n += int64(p.T.Numel())
		}
		if got := m.Config.NumParams(); got != n {
			t.Errorf("%s: NumParams %d, parameters hold %d", family, got, n)
		}
	}
}
