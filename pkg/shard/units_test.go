package shard

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// tinyModel is a random float64 model of a family (qwen2: tied embeddings; qwen3: an untied lm_head).
func tinyModel(t *testing.T, family string) *policy.Model {
	t.Helper()
	c := arch.Config{ModelType: family, HiddenSize: 16, IntermediateSize: 24, NumHiddenLayers: 3, NumAttentionHeads: 4,
		NumKeyValueHeads: 2, VocabSize: 40, MaxPositionEmbeddings: 64, TieWordEmbeddings: family == arch.Qwen2, InitializerRange: 0.3}
	c.FillDefaults()
	var m *policy.Model
	if err := torch.Do(func() error {
		var err error
		m, err = policy.NewRandom(c, gotch.CPU, gotch.Double, 7)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestUnitsMatchWholeModel: a model cut into units (one process: every shard the whole unit) scores,
// trains and saves exactly as the whole model does, each pass gathering its units through the
// policy's hooks: the scores are equal, the gradients the backward reduces into the shards are the
// whole model's, laid out unit by unit, and the saved folders are byte for byte the same. The
// weights hold no data outside the passes.
func TestUnitsMatchWholeModel(t *testing.T) {
	seqs := []policy.Sequence{{PromptIDs: []int{1, 2, 3}, ResponseIDs: []int{4, 5, 6, 7}}, {PromptIDs: []int{8, 9}, ResponseIDs: []int{10, 11}}}
	for _, family := range []string{arch.Qwen2, arch.Qwen3} {
		for _, checkpoint := range []bool{false, true} {
			whole, cut := tinyModel(t, family), tinyModel(t, family)
			var um *unitModel
			_ = torch.Do(func() error { um = newUnitModel("m", cut, nil, &rounds{}, true, false); return nil })
			for _, p := range cut.Parameters() {
				if p.T.Numel() != 0 {
					t.Fatalf("%s: %s holds %d elements outside a pass", family, p.Name, p.T.Numel())
				}
			}
			err := torch.Do(func() error {
				s := torch.NewScope()
				defer s.Close()
				a, err := whole.Score(seqs, true, 0)
				if err != nil {
					return err
				}
				b, err := cut.Score(seqs, true, 0)
				if err != nil {
					return err
				}
				if d := maxDiff(a.LogProbs, b.LogProbs); d != 0 {
					t.Errorf("%s: scores differ by %g", family, d)
				}
				backward(t, whole, seqs, checkpoint)
				torch.DefineGrads(um.shards()) // for a backward to reduce into
				backward(t, cut, seqs, checkpoint)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			sameGrads(t, whole, um)
			sameSaved(t, whole, cut)
		}
	}
}

// backward runs a training forward and backward of a loss on the scores.
func backward(t *testing.T, m *policy.Model, seqs []policy.Sequence, checkpoint bool) {
	t.Helper()
	s := torch.NewScope()
	defer s.Close()
	sc, bp, err := m.TrainScore(seqs, true, checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	loss := sc.LogProbs.MustSum(gotch.Double, false).MustAdd(sc.Entropy.MustMean(gotch.Double, false), true)
	bp.Backward(loss)
}

// shards are the model's units' shards.
func (um *unitModel) shards() []*ts.Tensor {
	var out []*ts.Tensor
	for _, u := range um.units {
		out = append(out, u.shard)
	}
	return out
}

func maxDiff(a, b *ts.Tensor) float64 {
	return a.MustSub(b, false).MustAbs(true).MustMax(true).Float64Values()[0]
}

// sameGrads compares the whole model's gradients with the shards' (one process: a shard is its
// whole unit).
func sameGrads(t *testing.T, whole *policy.Model, um *unitModel) {
	t.Helper()
	byName := map[string]*ts.Tensor{}
	for _, p := range whole.Parameters() {
		byName[p.Name] = p.T
	}
	_ = torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		for _, u := range um.units {
			g := u.shard.MustGrad(false)
			for j, name := range u.names {
				want := byName[name].MustGrad(false).MustReshape([]int64{-1}, false)
				got := g.MustNarrow(0, u.offs[j], numel(u.shapes[j]), false)
				if d := maxDiff(want, got); d > 1e-12 || math.IsNaN(d) {
					t.Errorf("gradient of %s differs by %g", name, d)
				}
			}
		}
		return nil
	})
}

// sameSaved saves both models and compares the files.
func sameSaved(t *testing.T, a, b *policy.Model) {
	t.Helper()
	da, db := t.TempDir(), t.TempDir()
	if err := torch.Do(func() error {
		if err := a.Save(da); err != nil {
			return err
		}
		return b.Save(db)
	}); err != nil {
		t.Fatal(err)
	}
	x, _ := os.ReadFile(filepath.Join(da, "model.safetensors"))
	y, _ := os.ReadFile(filepath.Join(db, "model.safetensors"))
	if len(x) == 0 || !bytes.Equal(x, y) {
		t.Errorf("saved weights differ (%d vs %d bytes)", len(x), len(y))
	}
}

// TestCutUnitShards: a unit cut for rank r of N holds [r·per, (r+1)·per) of the flat unit, zero past
// its end, per = ⌈n/N⌉; its tensors hold nothing afterwards.
func TestCutUnitShards(t *testing.T) {
	m := tinyModel(t, arch.Qwen3)
	ps := m.UnitParams()[0]
	var n int64
	var flat []float64
	for _, p := range ps {
		n += int64(p.T.Numel())
		flat = append(flat, p.T.MustReshape([]int64{-1}, false).Float64Values()...)
	}
	const world = 3
	per := (n + world - 1) / world
	for r := 0; r < world; r++ {
		var u *unit
		fresh := tinyModel(t, arch.Qwen3).UnitParams()[0]
		_ = torch.Do(func() error {
			u = cutUnit(fresh, world, r, false)
			return nil
		})
		got := u.shard.Float64Values()
		if int64(len(got)) != per {
			t.Fatalf("rank %d: shard of %d elements, want %d", r, len(got), per)
		}
		for i, v := range got {
			k := int64(r)*per + int64(i)
			want := 0.0
			if k < n {
				want = flat[k]
			}
			if v != want {
				t.Fatalf("rank %d: shard[%d] = %g, want %g", r, i, v, want)
			}
		}
		for j, p := range u.params {
			if p.Numel() != 0 {
				t.Errorf("rank %d: %s still holds %d elements", r, u.names[j], p.Numel())
			}
		}
	}
}
