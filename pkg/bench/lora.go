package bench

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// benchLoRA times training steps of o.LoRAAdapters adapters on m, frozen, and measures an adapter
// folder's size. It runs on the torch thread.
func benchLoRA(m *policy.Model, seqs []policy.Sequence, o Options, r *Result) error {
	m.Freeze()
	defer m.Thaw()
	groups, free, err := newLoRAGroups(m, o, r)
	if err != nil {
		return err
	}
	defer free()
	r.LoRAAdapters, r.LoRARank = o.LoRAAdapters, o.LoRARank
	step := func() error {
		for _, g := range groups {
			if err := g.step(seqs, o.Checkpointing); err != nil {
				return err
			}
			torch.ReleaseMemory()
		}
		return nil
	}
	sec, err := timeTrainSteps(o, r, step)
	if err != nil {
		return err
	}
	r.TrainMsPerStep = sec * 1000
	for i := range seqs {
		r.TrainRealTokens += len(seqs[i].PromptIDs) + len(seqs[i].ResponseIDs)
	}
	r.MicroBatches = 1
	r.TrainTokensPerSec = float64(o.LoRAAdapters*r.TrainRealTokens) / sec
	r.AdapterFolderBytes, err = adapterFolderBytes(groups[0].view.Adapter())
	return err
}

// loraGroup is one adapter's training: the frozen model's view through it, its tensors and their
// optimizer.
type loraGroup struct {
	view    *policy.Model
	tensors []*ts.Tensor
	opt     *optim.AdamW
}

// newLoRAGroups makes o.LoRAAdapters adapters on m, each with its AdamW, and records an adapter's
// parameters in r; free releases them (in the reverse order of their making).
func newLoRAGroups(m *policy.Model, o Options, r *Result) (groups []loraGroup, free func(), err error) {
	var frees []func()
	free = func() {
		for i := len(frees) - 1; i >= 0; i-- {
			frees[i]()
		}
	}
	targets := o.LoRATargets
	if len(targets) == 0 {
		targets = []string{arch.LoRAAllLinear}
	}
	for i := range o.LoRAAdapters {
		a, err := policy.NewAdapter(m, fmt.Sprintf("agent%d", i), policy.LoRAConfig{Rank: o.LoRARank, Alpha: float64(2 * o.LoRARank), Targets: targets}, m.DType(), o.Seed+int64(i))
		if err != nil {
			free()
			return nil, nil, err
		}
		frees = append(frees, a.Free)
		v, err := m.WithAdapter(a)
		if err != nil {
			free()
			return nil, nil, err
		}
		names, tensors := policy.SplitParams(a.Parameters())
		opt := optim.NewAdamW(names, tensors, optim.AdamWOptions{LR: 1e-4, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
		frees = append(frees, opt.Free)
		groups = append(groups, loraGroup{v, tensors, opt})
		r.AdapterParams = a.NumParams()
	}
	return groups, free, nil
}

// step is one training step of the adapter: score, token-mean loss, backward, AdamW, and its
// gradients zeroed.
func (g loraGroup) step(seqs []policy.Sequence, checkpointing bool) error {
	s := torch.NewScope()
	defer s.Close()
	sc, bp, err := g.view.TrainScore(seqs, false, checkpointing)
	if err != nil {
		return err
	}
	loss := sc.LogProbs.MustSum(gotch.Invalid, false).MustDiv(sc.Mask.MustSum(gotch.Invalid, false), true).MustNeg(true)
	bp.Backward(loss)
	g.opt.Apply(g.opt.CurrentLR())
	return torch.NoGrad(func() error {
		for _, t := range g.tensors {
			if gr := t.MustGrad(false); gr.MustDefined() {
				gr.MustZero_()
			}
		}
		return nil
	})
}

// adapterFolderBytes is the size of the folder a saves to (its config and weights): what a training
// sends a serving engine for each adapter.
func adapterFolderBytes(a *policy.Adapter) (int64, error) {
	dir, err := os.MkdirTemp("", "drmas-bench-adapter-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	if err := a.Save(dir); err != nil {
		return 0, err
	}
	var n int64
	for _, f := range []string{policy.AdapterConfigFile, policy.AdapterWeightsFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return 0, err
		}
		n += st.Size()
	}
	return n, nil
}
