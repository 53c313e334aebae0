package train

import (
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
)

// wholeWeights is weights for every stage that keeps the models' whole weights on every rank.
type wholeWeights struct{}

func (wholeWeights) state(string) ([]string, []*ts.Tensor) { return nil, nil }

func (wholeWeights) sharded(string) bool { return false }

func (wholeWeights) settle() error { return nil }

func (wholeWeights) whole(fn func() error) error { return fn() }

func (wholeWeights) reference(_ string, m *policy.Model) (*policy.Model, error) { return m.Clone() }

func (wholeWeights) adopt(string, *policy.Model, bool) error { return nil }

func (wholeWeights) writeOptim(_ string, opt *optim.AdamW, path string, meta map[string]string) error {
	names, tensors := optimTensors(opt)
	return policy.SaveTensors(path, names, tensors, meta)
}

func (wholeWeights) restore(_ string, opt *optim.AdamW, dir string) error {
	return loadOptimState(opt, dir)
}
