package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
)

// Golden logits from testdata/golden.py: an independent PyTorch transcription of transformers'
// forward of every registered family on tiny random checkpoints (llama3 rope scaling; Qwen2 biases,
// tied head and bfloat16 weights on disk; Qwen3 q/k norms and an explicit head_dim …). A family
// without a golden folder fails. It runs twice: with the default attention tiles (one tile for
// these short sequences) and with tiles of two query rows (attention.go), so that every family's
// attention, Mistral's window included, is checked across tiles.
func TestGoldenLogits(t *testing.T) {
	t.Run("one-tile", testGoldenLogits)
	t.Run("tiles-of-2", func(t *testing.T) {
		defer smallTiles(2)()
		testGoldenLogits(t)
	})
}

// smallTiles makes attention tiles of rows query rows until the returned function restores the defaults.
func smallTiles(rows int64) (restore func()) {
	budget, cuda, floor := tileBudget, tileBudgetCUDA, tileFloor
	tileBudget, tileBudgetCUDA, tileFloor = 1, 1, rows
	return func() { tileBudget, tileBudgetCUDA, tileFloor = budget, cuda, floor }
}

func testGoldenLogits(t *testing.T) {
	for _, name := range arch.ModelTypes() {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "golden", name)
			data, err := os.ReadFile(filepath.Join(dir, "logits.json"))
			if err != nil {
				t.Fatal(err)
			}
			var golden struct {
				IDs    [][]int       `json:"ids"`
				Logits [][][]float64 `json:"logits"`
			}
			if err := json.Unmarshal(data, &golden); err != nil {
				t.Fatal(err)
			}
			onTorch(t, func() error {
				m, err := Load(dir, gotch.CPU, gotch.Float)
				if err != nil {
					return err
				}
				got := values(m.Forward(idsTensor(golden.IDs...), nil, nil, nil))
				V := m.Config.VocabSize
				worst := 0.0
				for b, row := range golden.Logits {
					for i, pos := range row {
						for v, want := range pos {
							d := math.Abs(got[(b*len(row)+i)*V+v] - want)
							worst = max(worst, d)
							if d > 1e-4 {
								return fmt.Errorf("logits[%d][%d][%d] = %.6f, PyTorch reference %.6f", b, i, v, got[(b*len(row)+i)*V+v], want)
							}
						}
					}
				}
				t.Logf("max |Δ| vs PyTorch: %.2g", worst)
				return nil
			})
		})
	}
}

// Left padding (the valid keys) and per-row positions gives each row the logits it has alone.
func TestLeftPaddedBatchMatchesUnpadded(t *testing.T) {
	for _, name := range arch.ModelTypes() {
		t.Run(name, func(t *testing.T) {
			onTorch(t, func() error {
				m, err := Load(filepath.Join("testdata", "golden", name), gotch.CPU, gotch.Float)
				if err != nil {
					return err
				}
				rows := [][]int{{1, 5, 9, 17, 33, 2, 40}, {7, 11, 3}, {1, 44, 3, 3, 28}}
				T := 7
				ids, pos, valid := make([][]int, len(rows)), make([]int64, 0), make([]bool, 0)
				for i, r := range rows {
					pad := T - len(r)
					ids[i] = make([]int, T)
					for j := 0; j < T; j++ {
						if j >= pad {
							ids[i][j] = r[j-pad]
							pos = append(pos, int64(j-pad))
						} else {
							pos = append(pos, 0)
						}
						valid = append(valid, j >= pad)
					}
				}
				B := int64(len(rows))
				validT := ts.MustOfSlice(valid).MustView([]int64{B, int64(T)}, true)
				posT := ts.MustOfSlice(pos).MustView([]int64{B, int64(T)}, true)
				batch := values(m.Forward(idsTensor(ids...), posT, validT, nil))
				V := m.Config.VocabSize
				for i, r := range rows {
					alone := values(m.Forward(idsTensor(r), nil, nil, nil))
					pad := T - len(r)
					for j := range r {
						for v := 0; v < V; v++ {
							got, want := batch[(i*T+pad+j)*V+v], alone[j*V+v]
							if math.Abs(got-want) > 1e-5 {
								return fmt.Errorf("row %d token %d vocab %d: padded batch %.7f, alone %.7f", i, j, v, got, want)
							}
						}
					}
				}
				return nil
			})
		})
	}
}

// The KV cache gives the same logits as recomputing the whole sequence, prefill and decode steps.
func TestForwardWithCacheMatchesFull(t *testing.T) {
	onTorch(t, func() error {
		m, err := Load(filepath.Join("testdata", "golden", "qwen3"), gotch.CPU, gotch.Float)
		if err != nil {
			return err
		}
		seq := []int{1, 44, 3, 3, 28, 19, 6, 0, 47}
		full := values(m.Forward(idsTensor(seq), nil, nil, nil))
		cache := NewKVCache(m, 1, len(seq))
		var got []float64
		got = append(got, values(m.Forward(idsTensor(seq[:4]), nil, nil, cache))...)
		got = append(got, values(m.Forward(idsTensor(seq[4:6]), nil, nil, cache))...)
		for _, id := range seq[6:] {
			got = append(got, values(m.Forward(idsTensor([]int{id}), nil, nil, cache))...)
		}
		if cache.Len() != len(seq) {
			return fmt.Errorf("cache holds %d positions, want %d", cache.Len(), len(seq))
		}
		for i := range full {
			if math.Abs(full[i]-got[i]) > 1e-5 {
				return fmt.Errorf("logit %d: with cache %.7f, full %.7f", i, got[i], full[i])
			}
		}
		return nil
	})
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// With a sliding window of w tokens, a one-layer model's last logits are those of its last w tokens
// alone (rotary embeddings only see relative positions), and the KV cache (prefill, then one token
// at a time) gives what the whole windowed sequence gives.
func TestSlidingWindow(t *testing.T) {
	onTorch(t, func() error {
		c := tinyConfig(arch.Llama, 48)
		c.NumHiddenLayers = 1
		m, err := NewRandom(c, gotch.CPU, gotch.Float, 3)
		if err != nil {
			return err
		}
		seq := []int{1, 44, 3, 3, 28, 19, 6, 0, 47}
		full := values(m.Forward(idsTensor(seq), nil, nil, nil))
		const w = 3
		m.opts.Window = w
		win := values(m.Forward(idsTensor(seq), nil, nil, nil))
		alone := values(m.Forward(idsTensor(seq[len(seq)-w:]), nil, nil, nil))
		V, n := c.VocabSize, len(seq)
		for v := 0; v < V; v++ {
			if got, want := win[(n-1)*V+v], alone[(w-1)*V+v]; math.Abs(got-want) > 1e-5 {
				return fmt.Errorf("vocab %d: windowed %.7f, last %d tokens alone %.7f", v, got, w, want)
			}
		}
		// The first w positions see no difference; a later one does.
		for i := 0; i < w*V; i++ {
			if math.Abs(win[i]-full[i]) > 1e-6 {
				return fmt.Errorf("logit %d inside the window changed: %.7f vs %.7f", i, win[i], full[i])
			}
		}
		if math.Abs(win[(n-1)*V]-full[(n-1)*V]) < 1e-6 {
			return fmt.Errorf("the window changed nothing at the last position")
		}
		cache := NewKVCache(m, 1, n)
		got := values(m.Forward(idsTensor(seq[:5]), nil, nil, cache))
		for _, id := range seq[5:] {
			got = append(got, values(m.Forward(idsTensor([]int{id}), nil, nil, cache))...)
		}
		for i := range win {
			if math.Abs(win[i]-got[i]) > 1e-5 {
				return fmt.Errorf("logit %d: windowed with cache %.7f, without %.7f", i, got[i], win[i])
			}
		}
		return nil
	})
}
