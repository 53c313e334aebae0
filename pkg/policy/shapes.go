package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sugarme/gotch"
)

// WeightShape is one weight of a model as its checkpoint names it, without a tensor.
type WeightShape struct {
	Name  string  `json:"name"`
	Shape []int64 `json:"shape"`
}

// Numel is the number of elements of the weight.
func (w WeightShape) Numel() int64 {
	n := int64(1)
	for _, d := range w.Shape {
		n *= d
	}
	return n
}

// Shapes lists every weight a model of cfg holds (a tied lm_head once), sorted by name as
// Model.Parameters is, from the family's structure alone: no tensor is allocated, so a folder
// holding only config.json is enough (the memory plan of pkg/plan reads it before anything loads).
func Shapes(cfg Config) ([]WeightShape, error) {
	if lookup(cfg.ModelType) == nil {
		return nil, fmt.Errorf("model_type %q: want one of %s", cfg.ModelType, strings.Join(ModelTypes(), ", "))
	}
	var out []WeightShape
	for _, s := range skeleton(cfg, gotch.CPU, gotch.Float).slots() {
		out = append(out, WeightShape{Name: s.name, Shape: slices.Clone(s.shape)})
	}
	slices.SortFunc(out, func(a, b WeightShape) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ParamCount is the number of parameters of a model of cfg (the sum over Shapes).
func ParamCount(cfg Config) (int64, error) {
	ws, err := Shapes(cfg)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, w := range ws {
		n += w.Numel()
	}
	return n, nil
}
