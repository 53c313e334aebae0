package train

import (
	"math"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/torch"
)

func tensor2(rows [][]float32) *ts.Tensor {
	var flat []float32
	for _, r := range rows {
		flat = append(flat, r...)
	}
	return ts.MustOfSlice(flat).MustView([]int64{int64(len(rows)), int64(len(rows[0]))}, true)
}

func values(t *ts.Tensor) []float64 { return t.Float64Values() }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-5 }

func TestPGLossHandComputed(t *testing.T) {
	torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		ln := func(x float64) float32 { return float32(math.Log(x)) }
		// seq 0: A = +1, ratios 1.5 and 0.5; seq 1: A = −1, ratios 1.5 and 5.
		logp := tensor2([][]float32{{ln(1.5), ln(0.5)}, {ln(1.5), ln(5)}})
		old := tensor2([][]float32{{0, 0}, {0, 0}})
		adv := ts.MustOfSlice([]float32{1, -1})
		loss, clipped, lower, negLR := PGLoss(logp, old, adv, 0.2, 0.2, 3)
		// A=+1, r=1.5: max(−1.5, −1.2) = −1.2 (clipped); r=0.5: max(−0.5, −0.8) = −0.5.
		// A=−1, r=1.5: max(1.5, 1.2) = 1.5; r=5: max(5, 1.2) = 5 → dual clip min(5, 3) = 3.
		want := []float64{-1.2, -0.5, 1.5, 3}
		wantClip := []float64{1, 0, 0, 0}
		wantLower := []float64{0, 0, 0, 1}
		for i, v := range values(loss) {
			if !near(v, want[i]) {
				t.Errorf("loss[%d] = %g, want %g", i, v, want[i])
			}
		}
		for i, v := range values(clipped) {
			if v != wantClip[i] {
				t.Errorf("clipped[%d] = %g, want %g", i, v, wantClip[i])
			}
		}
		for i, v := range values(lower) {
			if v != wantLower[i] {
				t.Errorf("clipped lower[%d] = %g, want %g", i, v, wantLower[i])
			}
		}
		if v := values(negLR)[3]; !near(v, -math.Log(5)) {
			t.Errorf("-log ratio = %g, want %g", v, -math.Log(5))
		}
		// Without dual clip the last token keeps 5.
		loss, _, _, _ = PGLoss(logp, old, adv, 0.2, 0.2, 0)
		if v := values(loss)[3]; !near(v, 5) {
			t.Errorf("no dual clip: loss = %g, want 5", v)
		}
		return nil
	})
}

func TestKLPenalty(t *testing.T) {
	torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		logp := tensor2([][]float32{{-1, -2}})
		ref := tensor2([][]float32{{-1.5, -2}})
		for _, c := range []struct {
			kind string
			want float64
		}{
			{"k1", 0.5},
			{"k2", 0.125},
			{"k3", math.Exp(-0.5) + 0.5 - 1},
		} {
			kl, err := KLPenalty(logp, ref, c.kind)
			if err != nil {
				t.Fatal(err)
			}
			v := values(kl)
			if !near(v[0], c.want) || !near(v[1], 0) {
				t.Errorf("%s = %v, want [%g 0]", c.kind, v, c.want)
			}
		}
		if _, err := KLPenalty(logp, ref, "k9"); err == nil {
			t.Error("unknown KL type accepted")
		}
		return nil
	})
}

func TestAggregate(t *testing.T) {
	torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		loss := tensor2([][]float32{{1, 2, 3}, {4, 5, 6}})
		mask := tensor2([][]float32{{1, 1, 0}, {1, 1, 1}}) // lengths 2 and 3
		d := Denominators{Tokens: 10, Seqs: 4, Horizon: 8}
		cases := map[string]float64{
			TokenMean:           (1 + 2 + 4 + 5 + 6) / 10.0,
			SeqMeanTokenSum:     (3 + 15) / 4.0,
			SeqMeanTokenMean:    (1.5 + 5) / 4.0,
			SeqMeanTokenSumNorm: 18 / 8.0,
		}
		for mode, want := range cases {
			got, err := Aggregate(loss, mask, mode, d)
			if err != nil {
				t.Fatal(err)
			}
			if v := values(got)[0]; !near(v, want) {
				t.Errorf("%s = %g, want %g", mode, v, want)
			}
		}
		if _, err := Aggregate(loss, mask, "mean", d); err == nil {
			t.Error("unknown mode accepted")
		}
		return nil
	})
}

func TestAdamWStep(t *testing.T) {
	torch.Do(func() error {
		p := ts.MustOfSlice([]float32{1, -2}).MustSetRequiresGrad(true, true)
		opt := optim.NewAdamW([]string{"p"}, []*ts.Tensor{p}, optim.AdamWOptions{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01})
		s := torch.NewScope()
		loss := p.MustMul(ts.MustOfSlice([]float32{0.5, 0.5}), false).MustSum(gotch.Float, true) // grad 0.5
		loss.MustBackward()
		s.Close()
		if n := GradNorm([]*ts.Tensor{p}); !near(n, math.Sqrt(0.5)) {
			t.Errorf("grad norm = %g, want %g", n, math.Sqrt(0.5))
		}
		opt.Apply(opt.CurrentLR())
		// Step 1: m̂ = g, v̂ = g², so the update is lr·sign(g); decay first: θ(1 − lr·wd).
		got := p.Float64Values()
		want := []float64{1*(1-0.001) - 0.1, -2*(1-0.001) - 0.1}
		for i := range want {
			if !near(got[i], want[i]) {
				t.Errorf("θ[%d] = %g, want %g", i, got[i], want[i])
			}
		}
		if opt.Step != 1 || !near(opt.M[0].Float64Values()[0], 0.05) || !near(opt.V[0].Float64Values()[0], 0.00025) {
			t.Errorf("state after one step: step %d, m %v, v %v", opt.Step, opt.M[0].Float64Values(), opt.V[0].Float64Values())
		}
		ScaleGrads([]*ts.Tensor{p}, 2)
		if n := GradNorm([]*ts.Tensor{p}); !near(n, 2*math.Sqrt(0.5)) {
			t.Errorf("scaled grad norm = %g", n)
		}
		ZeroGrad([]*ts.Tensor{p})
		if n := GradNorm([]*ts.Tensor{p}); n != 0 {
			t.Errorf("grad norm after ZeroGrad = %g", n)
		}
		return nil
	})
}

func TestAdamWWarmup(t *testing.T) {
	o := &optim.AdamW{AdamWOptions: optim.AdamWOptions{LR: 1, WarmupSteps: 4}}
	for step, want := range []float64{0.25, 0.5, 0.75, 1, 1} {
		o.Step = step
		if got := o.CurrentLR(); !near(got, want) {
			t.Errorf("step %d: lr %g, want %g", step, got, want)
		}
	}
}
