package train

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/torch"
)

// refWeights is the correction's formula in float64, row by row: r = exp(old − b) on the known
// tokens; tis w = min(r, C) (truncated where r > C); the masks keep a token (token_mask), or every
// token of a row (seq_mask: Σ log r; geo_mask: Σ log r over the known tokens' count) whose log ratio
// lies within [−ln C, ln C].
func refWeights(old, b, known [][]float64, mode string, c float64) (w, trunc, masked [][]float64) {
	lnC := math.Log(c)
	for i := range old {
		n := len(old[i])
		w, trunc, masked = append(w, make([]float64, n)), append(trunc, make([]float64, n)), append(masked, make([]float64, n))
		sum, cnt := 0.0, 0.0
		for j := range old[i] {
			if known[i][j] > 0 {
				sum += old[i][j] - b[i][j]
				cnt++
			}
		}
		for j := range old[i] {
			w[i][j] = 1
			if known[i][j] == 0 {
				continue
			}
			lr := old[i][j] - b[i][j]
			var out bool
			switch mode {
			case algo.CorrectionTIS:
				if r := math.Exp(lr); r > c {
					w[i][j], trunc[i][j] = c, 1
				} else {
					w[i][j] = r
				}
			case algo.CorrectionTokenMask:
				out = math.Abs(lr) > lnC
			case algo.CorrectionSeqMask:
				out = math.Abs(sum) > lnC
			case algo.CorrectionGeoMask:
				out = math.Abs(sum/math.Max(cnt, 1)) > lnC
			}
			if out {
				w[i][j], masked[i][j] = 0, 1
			}
		}
	}
	return w, trunc, masked
}

func matrix(t *ts.Tensor) [][]float64 {
	sz := t.MustSize()
	flat := t.MustTotype(gotch.Double, false).Float64Values(true)
	out := make([][]float64, sz[0])
	for i := range out {
		out[i] = flat[i*int(sz[1]) : (i+1)*int(sz[1])]
	}
	return out
}

func tensorOf(rows [][]float64) *ts.Tensor {
	var flat []float64
	for _, r := range rows {
		flat = append(flat, r...)
	}
	return ts.MustOfSlice(flat).MustView([]int64{int64(len(rows)), int64(len(rows[0]))}, true)
}

// The correction's weights, truncation and masks equal the float64 reference formula on behaviour
// log-probs perturbed from the old ones (small and large gaps, both signs, unknown tokens), for
// every registered correction; none weighs every token 1.
func TestRolloutWeightsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	const B, T, C = 6, 9, 2.0
	old, b, known := make([][]float64, B), make([][]float64, B), make([][]float64, B)
	for i := 0; i < B; i++ {
		old[i], b[i], known[i] = make([]float64, T), make([]float64, T), make([]float64, T)
		for j := 0; j < T; j++ {
			old[i][j] = -rng.Float64() * 5
			gap := rng.NormFloat64() * []float64{0.01, 0.3, 1.5}[i%3] // rows near 1, some beyond [1/C, C]
			b[i][j] = old[i][j] + gap
			if j < T-i%3 { // the tail of some rows is padding
				known[i][j] = 1
			}
		}
	}
	// Row 0 straddles ln C ≈ 0.6931 token by token (old − b within a hair of ±ln C).
	for j, lr := range []float64{0.69, 0.6935, -0.6935, 0.692, -0.692, 0.7, -0.7, 0.1, -0.1} {
		b[0][j], known[0][j] = old[0][j]-lr, 1
	}
	err := torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		for _, mode := range algo.RolloutCorrections.Names() {
			w, tr, mk, err := RolloutWeights(tensorOf(old), tensorOf(b), tensorOf(known), mode, C)
			if err != nil {
				return err
			}
			rw, rt, rm := refWeights(old, b, known, mode, C)
			if mode == algo.CorrectionNone {
				rw, rt, rm = refWeights(old, old, known, algo.CorrectionTIS, C) // all ones, nothing cut
			}
			for name, pair := range map[string][2][][]float64{"weights": {matrix(w), rw}, "truncated": {matrix(tr), rt}, "masked": {matrix(mk), rm}} {
				got, want := pair[0], pair[1]
				for i := range want {
					for j := range want[i] {
						if math.Abs(got[i][j]-want[i][j]) > 1e-12*(1+math.Abs(want[i][j])) {
							t.Errorf("%s %s[%d][%d] = %.15g, reference %.15g", mode, name, i, j, got[i][j], want[i][j])
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// With the generator's log-probs equal to the old ones, every correction leaves the update
// bit-identical to none (weights exactly 1); with them perturbed, tis changes it and reports its
// figures: the weights' mean, the fraction truncated, and a KL(π_b ‖ π_old) above zero.
func TestCorrectionWithBehaviourEqualOldIsBitIdentical(t *testing.T) {
	cfg := tinyConfig(t, t.TempDir(), "warmup.steps=0", "algorithm.kl.coef=0")
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ms := modelOf(tr, "small")
	items := synthItems("solver", "verifier")
	grads := func(mode string, served func(old []float32) []float32) ([][]float64, stepStats) {
		var g [][]float64
		var st stepStats
		err := torch.Do(func() error {
			for _, x := range items {
				x.served = served(x.old)
			}
			ms.loss.correction = mode
			ZeroGrad(ms.params)
			var err error
			if st, err = ms.backward(newMiniBatch(items, 4, false), ms.params); err != nil {
				return err
			}
			g = gradSnapshot(ms.params)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return g, st
	}
	if err := torch.Do(func() error {
		return ms.recordLogProbs(ms.pol, ms.loss.microBatches(items, 8), func(x *item, lp []float32) { x.old = lp })
	}); err != nil {
		t.Fatal(err)
	}
	same := func(old []float32) []float32 { return append([]float32(nil), old...) }
	plain, _ := grads(algo.CorrectionNone, same)
	for _, mode := range algo.RolloutCorrections.Names() {
		g, st := grads(mode, same)
		for i := range plain {
			for j := range plain[i] {
				if g[i][j] != plain[i][j] {
					t.Fatalf("%s with π_b = π_old: gradient %d[%d] = %v, without correction %v", mode, i, j, g[i][j], plain[i][j])
				}
			}
		}
		for _, a := range st.agents {
			if c := a.loss.corr; mode != algo.CorrectionNone && (c.tokens == 0 || c.weight != c.tokens || c.kl != 0 || c.masked != 0) {
				t.Errorf("%s, agent %s: %+v, want every known token weighing 1, none masked, KL 0", mode, a.agent, c)
			}
		}
	}
	// Behaviour log-probs 1.5 nats below the old ones: r = e^1.5 > C = 2, every token truncated.
	lower := func(old []float32) []float32 {
		out := make([]float32, len(old))
		for i, v := range old {
			out[i] = v - 1.5
		}
		return out
	}
	g, st := grads(algo.CorrectionTIS, lower)
	differs := false
	for i := range plain {
		for j := range plain[i] {
			differs = differs || g[i][j] != plain[i][j]
		}
	}
	if !differs {
		t.Error("tis with π_old/π_b = e^1.5 left the gradient unchanged")
	}
	for _, a := range st.agents {
		c := a.loss.corr
		if c.truncated != c.tokens || math.Abs(c.weight/c.tokens-2) > 1e-6 || c.maxWeight != 2 || !(c.kl > 0) {
			t.Errorf("agent %s: %+v, want every token truncated at weight 2 and KL > 0", a.agent, c)
		}
	}
}

// A short run with the correction on writes its figures (local generation: π_b is the sampler's own
// log-probs, so weights stay near 1) and trains as usual.
func TestCorrectionMetrics(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=2", "warmup.steps=0", "algorithm.rollout_correction={mode: tis, threshold: 2}"), Options{})
	rows := readRows(t, dir)
	for _, k := range []string{"rollout_corr/weight_mean/model/small", "rollout_corr/weight_max/agent/solver", "rollout_corr/truncated/agent/verifier", "rollout_corr/kl/model/small"} {
		v, ok := rows[len(rows)-1][k].(float64)
		if !ok {
			t.Fatalf("no %s in %v", k, rows[len(rows)-1])
		}
		if k == "rollout_corr/weight_mean/model/small" && math.Abs(v-1) > 1e-3 {
			t.Errorf("%s = %v, want ≈ 1 (the sampler's own log-probs)", k, v)
		}
	}
}
