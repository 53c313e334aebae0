package train

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
)

// Loss balancing weights each call's policy-gradient loss and nothing else, as the reference's
// compute_policy_loss does (pg_losses · loss_weights before agg_loss; the KL and entropy terms
// unweighted): with the weights at 1 the gradient is bit-identical to the unweighted one, and with
// weights w it equals the gradient of the unweighted loss on the advantages w·A (on-policy, where
// the clipped pg loss is linear in A), the KL and entropy terms on.
func TestLossBalanceWeightsThePGLossOnly(t *testing.T) {
	cfg := tinyConfig(t, t.TempDir(), "warmup.steps=0", "algorithm.kl.coef=0.3", "algorithm.entropy_coef=0.01")
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ms := modelOf(tr, "small")
	items := synthItems("solver", "verifier")
	weights := []float64{0.5, 0.5, 1.5, 3, 0.25, 1}
	grads := func(balance bool, lw func(i int) float64, adv func(i int, a float64) float64) [][]float64 {
		var g [][]float64
		err := torch.Do(func() error {
			if ms.ref == nil { // made at the start of Run
				if err := ms.makeReference(); err != nil {
					return err
				}
			}
			if err := ms.recordLogProbs(ms.ref, ms.loss.microBatches(items, 8), func(x *item, lp []float32) { x.ref = lp }); err != nil {
				return err
			}
			saved := make([]float64, len(items))
			for i, x := range items {
				saved[i] = x.adv
				x.lw, x.adv = lw(i), adv(i, x.adv)
			}
			defer func() {
				for i, x := range items {
					x.adv = saved[i]
				}
			}()
			ms.loss.balance = balance
			ZeroGrad(ms.params)
			if _, err := ms.backward(newMiniBatch(items, 4, true), ms.params); err != nil {
				return err
			}
			g = gradSnapshot(ms.params)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	one := func(int) float64 { return 1 }
	same := func(_ int, a float64) float64 { return a }
	plain := grads(false, one, same)
	for i, g := range grads(true, one, same) {
		for j := range g {
			if g[j] != plain[i][j] {
				t.Fatalf("weights 1: gradient %d[%d] = %v, unweighted %v", i, j, g[j], plain[i][j])
			}
		}
	}
	weighted := grads(true, func(i int) float64 { return weights[i] }, same)
	scaled := grads(false, one, func(i int, a float64) float64 { return weights[i] * a })
	differs := false
	for i := range weighted {
		for j := range weighted[i] {
			w, s := weighted[i][j], scaled[i][j]
			if math.Abs(w-s) > 1e-5*math.Max(1e-3, math.Abs(s)) {
				t.Fatalf("gradient %d[%d]: weighted %v, on w·A %v", i, j, w, s)
			}
			differs = differs || w != plain[i][j]
		}
	}
	if !differs {
		t.Fatal("the weights left the gradient unchanged")
	}
}

// With KL in the reward and the adaptive controller (and loss balancing), each iteration's
// coefficient is the previous one updated by verl's rule from the previous iteration's KL over its
// sequences (a first iteration at the reference has KL 0), trainer.json carries β, a resumed run
// continues exactly as an uninterrupted one, and the rows carry the reference's diagnostics.
func TestKLInRewardAdaptiveAndResume(t *testing.T) {
	sets := []string{"algorithm.kl_in_reward.coef=0.05", "algorithm.kl_in_reward.controller=adaptive",
		"algorithm.kl_in_reward.target=0.001", "algorithm.kl_in_reward.horizon=50", "warmup.steps=0",
		"algorithm.balance_loss_by_agent_freq=true"}
	whole, parts := t.TempDir(), t.TempDir()
	train(t, tinyConfig(t, whole, sets...), Options{})
	rows := readRows(t, whole)
	if len(rows) != 4 {
		t.Fatalf("%d rows", len(rows))
	}
	coef := func(r map[string]any, k string) float64 { v, _ := r[k].(float64); return v }
	for _, k := range []string{metric.AdvDiagAgent("solver", metric.DiagInflationMean), metric.AdvStdDistAgent("verifier", metric.StdMedian),
		metric.AdvStdDistAgent("solver", metric.StdFracBelow[1]), metric.AdvNormAgent("verifier", metric.AbsAdvP99)} {
		if _, ok := rows[0][k]; !ok {
			t.Errorf("metrics lack %s", k)
		}
	}
	if c := coef(rows[0], metric.KLInRewardCoef); c != 0.05 {
		t.Fatalf("first coef %v, want 0.05", c)
	}
	if kl := coef(rows[0], metric.KLInRewardKL); kl != 0 {
		t.Errorf("first iteration's KL %v, want 0 (the policy is its reference)", kl)
	}
	for i := 1; i < len(rows); i++ {
		kl, prev := coef(rows[i-1], metric.KLInRewardKL), coef(rows[i-1], metric.KLInRewardCoef)
		n := 0.0 // the previous iteration's sequences: every call with response tokens
		for k, v := range rows[i-1] {
			if len(k) > len("calls/agent/") && k[:len("calls/agent/")] == "calls/agent/" {
				n += v.(float64) * 16 // calls per trajectory × 16 trajectories (4 tasks × 4)
			}
		}
		want := prev * (1 + math.Max(-0.2, math.Min(0.2, kl/0.001-1))*n/50)
		if got := coef(rows[i], metric.KLInRewardCoef); math.Abs(got-want) > 1e-9*want {
			t.Errorf("iteration %d: coef %v, want %v (KL %v over %v sequences)", i+1, got, want, kl, n)
		}
	}
	if coef(rows[3], metric.KLInRewardKL) <= 0 {
		t.Error("no KL after three updates")
	}
	b, err := os.ReadFile(filepath.Join(rundir.CheckpointDir(whole, 4), "trainer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st rundir.TrainerState
	if err := json.Unmarshal(b, &st); err != nil || st.KLInRewardCoef == nil {
		t.Fatalf("trainer.json: %s (%v): no kl_in_reward_coef", b, err)
	}
	train(t, tinyConfig(t, parts, append(sets, "run.steps=2")...), Options{})
	train(t, tinyConfig(t, parts, sets...), Options{Resume: true})
	sameRows(t, rows, readRows(t, parts))
}
