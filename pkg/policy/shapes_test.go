package policy

import (
	"slices"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// arch.Shapes names and sizes exactly the tensors a NewRandom model holds, for every family.
func TestShapesMatchRandomModel(t *testing.T) {
	for _, family := range arch.ModelTypes() {
		for _, tied := range []bool{true, false} {
			c := tinyConfig(family, 64)
			c.TieWordEmbeddings = tied
			var m *Model
			if err := torch.Do(func() error {
				var err error
				m, err = NewRandom(c, gotch.CPU, gotch.Float, 1)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			ws, err := arch.Shapes(m.Config)
			if err != nil {
				t.Fatal(err)
			}
			ps := m.Parameters()
			if len(ws) != len(ps) {
				t.Fatalf("%s tied=%v: %d shapes, the model holds %d tensors", family, tied, len(ws), len(ps))
			}
			var total int64
			for i, p := range ps {
				if ws[i].Name != p.Name || !slices.Equal(ws[i].Shape, p.T.MustSize()) {
					t.Errorf("%s tied=%v: shape %d is %s %v, the model's tensor is %s %v", family, tied, i, ws[i].Name, ws[i].Shape, p.Name, p.T.MustSize())
				}
				total += int64(p.T.Numel())
			}
			if n, err := arch.ParamCount(m.Config); err != nil || n != total {
				t.Errorf("%s tied=%v: arch.ParamCount %d (%v), the tensors hold %d", family, tied, n, err, total)
			}
		}
	}
	if _, err := arch.ParamCount(arch.Config{ModelType: "gpt2"}); err == nil {
		t.Error("arch.ParamCount of an unknown model_type: no error")
	}
}

// arch.Config.NumParams (from arch.Shapes, without tensors) counts what Parameters holds.
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
