package train

import (
	"context"
	"math"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/inspect"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// Counterfactual mode on a tiny math team after a format warm-up (so that groups have variance),
// checked against an independent computation on the same rollout batches: the GRPO and Dr. MAS
// advantages by their formulas (docs/algorithm.md), each agent's gradient norm from a plain backward of
// its calls' on-policy loss alone, the measured ratio, the ΣA² ratio and the Lemma 4.2 prediction.
// Every normalization's norm is reported, and a rerun gives the same report.
func TestCounterfactual(t *testing.T) {
	dir := t.TempDir()
	cfg := tinyConfig(t, dir, "algorithm.group_size=8", "run.steps=1", "warmup.steps=40", "warmup.lr=1e-2")
	train(t, cfg, Options{})
	const batches = 2
	loadTeam := func() *Team {
		team, err := LoadTeam(cfg, "cpu", filepath.Join(dir, "step-1"))
		if err != nil {
			t.Fatal(err)
		}
		return team
	}

	team := loadTeam()
	var want []inspect.CounterfactualRow
	for b := 1; b <= batches; b++ {
		roll, _, err := team.rollout(context.Background(), team.Router, b)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, referenceRows(t, cfg, team.Router["small"], roll, b)...)
	}
	team.Close()

	run := func() *inspect.CounterfactualReport {
		team := loadTeam()
		defer team.Close()
		rep, err := Counterfactual(context.Background(), team, batches)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rep := run()
	if len(rep.Rows) != len(want) {
		t.Fatalf("%d rows, want %d (one per agent and batch)", len(rep.Rows), len(want))
	}
	agree := func(got, want float64) bool {
		if math.IsNaN(want) || math.IsInf(want, 0) {
			return math.IsNaN(got) && math.IsNaN(want) || got == want
		}
		return math.Abs(got-want) <= 1e-4*math.Abs(want)+1e-9
	}
	for i, r := range rep.Rows {
		w := want[i]
		if r.Batch != w.Batch || r.Agent != w.Agent || r.Calls != w.Calls {
			t.Errorf("row %d: batch %d %s with %d calls, want batch %d %s with %d", i, r.Batch, r.Agent, r.Calls, w.Batch, w.Agent, w.Calls)
			continue
		}
		for _, m := range Normalizations {
			if n, ok := r.Norms[m.Name]; !ok || !isFinite(n) || n < 0 {
				t.Errorf("batch %d %s: norm under %s = %v", r.Batch, r.Agent, m.Name, n)
			}
		}
		for _, c := range []struct {
			what      string
			got, want float64
		}{
			{"|g_grpo|", r.Norms["grpo"], w.Norms["grpo"]},
			{"|g_drmas|", r.Norms["drmas"], w.Norms["drmas"]},
			{"measured ratio", r.Measured, w.Measured},
			{"ΣA² ratio", r.AdvRatio, w.AdvRatio},
			{"predicted ratio", r.Predicted, w.Predicted},
		} {
			if !agree(c.got, c.want) {
				t.Errorf("batch %d %s: %s %g, independently %g", r.Batch, r.Agent, c.what, c.got, c.want)
			}
		}
	}
	if rep.AdvPairs < 1 || rep.SpearmanAdv < -1 || rep.SpearmanAdv > 1 {
		t.Errorf("advantage pairs %d, Spearman %g", rep.AdvPairs, rep.SpearmanAdv)
	}
	if again := run(); !reflect.DeepEqual(nanless(rep), nanless(again)) {
		t.Error("counterfactual reports differ between reruns")
	}
}

// referenceRows computes the rows of one rollout batch without the trainer's code: advantages by the
// formulas, and per agent the gradient norm of −Σ_calls A·Σ_tokens log p / (response tokens of the
// batch) — the token-mean clipped loss on-policy (ratio 1, so no clip is active), its share of it.
func referenceRows(t *testing.T, cfg *config.Config, pol *policy.Policy, roll *env.Rollout, batch int) []inspect.CounterfactualRow {
	t.Helper()
	n := cfg.Algorithm.Normalization
	samples := roll.Samples()
	grpo, drmas, inflation := referenceAdvantages(samples, n.Eps, n.MinStd)
	agents := map[string]*inspect.CounterfactualRow{}
	var names []string
	advSq := map[string][2]float64{}
	tokens := 0.0
	for i, s := range samples {
		if agents[s.Agent] == nil {
			agents[s.Agent] = &inspect.CounterfactualRow{Batch: batch, Agent: s.Agent, Norms: map[string]float64{}, Predicted: inflation[s.Agent]}
			names = append(names, s.Agent)
		}
		agents[s.Agent].Calls++
		sq := advSq[s.Agent]
		advSq[s.Agent] = [2]float64{sq[0] + grpo[i]*grpo[i], sq[1] + drmas[i]*drmas[i]}
		tokens += float64(len(roll.Trajectories[s.Traj].Calls[s.Call].ResponseIDs))
	}
	var rows []inspect.CounterfactualRow
	sort.Strings(names)
	for _, a := range names {
		r := agents[a]
		for mode, adv := range map[string][]float64{"grpo": grpo, "drmas": drmas} {
			var seqs []policy.Sequence
			var advs []float32
			for i, s := range samples {
				call := roll.Trajectories[s.Traj].Calls[s.Call]
				if s.Agent == a && len(call.ResponseIDs) > 0 {
					seqs = append(seqs, policy.Sequence{PromptIDs: call.PromptIDs, ResponseIDs: call.ResponseIDs})
					advs = append(advs, float32(adv[i]))
				}
			}
			r.Norms[mode] = plainGradNorm(t, pol, seqs, advs, tokens)
		}
		g, d := r.Norms["grpo"], r.Norms["drmas"]
		r.Measured, r.AdvRatio = g*g/(d*d), advSq[a][0]/advSq[a][1] // x/0 = +Inf, 0/0 = NaN
		rows = append(rows, *r)
	}
	return rows
}

// plainGradNorm is the L2 norm of the gradient of −Σᵢ advᵢ·Σₜ log pᵢₜ / tokens.
func plainGradNorm(t *testing.T, pol *policy.Policy, seqs []policy.Sequence, advs []float32, tokens float64) float64 {
	t.Helper()
	total := 0.0
	err := torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		params := pol.Model.Parameters()
		for _, p := range params {
			p.T.ZeroGrad()
		}
		sc, err := pol.Score(seqs, false)
		if err != nil {
			return err
		}
		logp := sc.LogProbs.MustTotype(gotch.Float, false).MustMul(sc.Mask.MustTotype(gotch.Float, false), true)
		adv := ts.MustOfSlice(advs).MustUnsqueeze(1, true)
		loss := logp.MustMul(adv, true).MustSum(gotch.Float, true).MustNeg(true).MustDivScalar(ts.FloatScalar(tokens), true)
		loss.MustBackward()
		_ = torch.NoGrad(func() error {
			for _, p := range params {
				if g := p.T.MustGrad(false); g.MustDefined() {
					total += g.MustTotype(gotch.Double, false).MustSquare(true).MustSum(gotch.Double, true).Float64Values()[0]
				}
			}
			return nil
		})
		for _, p := range params {
			p.T.ZeroGrad()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return math.Sqrt(total)
}

// referenceAdvantages computes, aligned with samples, global GRPO advantages (per prompt group, over
// trajectory averages: A = (s̄_traj − μ)/(σ + ε)) and agent-wise Dr. MAS ones (per prompt group and
// agent, over calls: A = (s − μ_k)/(σ_k + ε)), with unbiased σ floored at minStd and a one-unit group
// taking μ = 0, σ = 1; and each agent's Lemma 4.2 factor (σ_k² + (μ_k − μ)²)/σ² (population μ_k, σ_k
// of its calls; μ, σ the unfloored GRPO statistics) averaged over the groups with σ > 0.
func referenceAdvantages(samples []env.Sample, eps, minStd float64) (grpo, drmas []float64, inflation map[string]float64) {
	byUID := map[string][]int{}
	for i, s := range samples {
		byUID[s.UID] = append(byUID[s.UID], i)
	}
	grpo, drmas = make([]float64, len(samples)), make([]float64, len(samples))
	inflSum, inflN := map[string]float64{}, map[string]int{}
	for _, idx := range byUID {
		trajScores := map[string][]float64{}
		var trajs []string
		byAgent := map[string][]int{}
		for _, i := range idx {
			s := samples[i]
			if trajScores[s.TrajUID] == nil {
				trajs = append(trajs, s.TrajUID)
			}
			trajScores[s.TrajUID] = append(trajScores[s.TrajUID], s.Score)
			byAgent[s.Agent] = append(byAgent[s.Agent], i)
		}
		trajMean := map[string]float64{}
		var means []float64
		for _, tr := range trajs {
			trajMean[tr], _ = meanStd(trajScores[tr], false)
			means = append(means, trajMean[tr])
		}
		mu, sigma := meanStd(means, true)
		if len(means) == 1 {
			mu, sigma = 0, 1
		}
		for _, i := range idx {
			grpo[i] = (trajMean[samples[i].TrajUID] - mu) / (math.Max(sigma, minStd) + eps)
		}
		for agent, calls := range byAgent {
			scores := make([]float64, len(calls))
			for j, i := range calls {
				scores[j] = samples[i].Score
			}
			muK, sigmaK := meanStd(scores, true)
			if len(scores) == 1 {
				muK, sigmaK = 0, 1
			}
			for j, i := range calls {
				drmas[i] = (scores[j] - muK) / (math.Max(sigmaK, minStd) + eps)
			}
			if len(means) >= 2 && sigma > 0 {
				pm, ps := meanStd(scores, false)
				inflSum[agent] += (ps*ps + (pm-mu)*(pm-mu)) / (sigma * sigma)
				inflN[agent]++
			}
		}
	}
	inflation = map[string]float64{}
	for _, s := range samples {
		inflation[s.Agent] = math.NaN()
		if inflN[s.Agent] > 0 {
			inflation[s.Agent] = inflSum[s.Agent] / float64(inflN[s.Agent])
		}
	}
	return grpo, drmas, inflation
}

// meanStd returns the mean (exactly the value when all are equal) and the std, unbiased (n−1) or not.
func meanStd(x []float64, unbiased bool) (float64, float64) {
	sum, same := 0.0, true
	for _, v := range x {
		sum += v
		same = same && v == x[0]
	}
	if same {
		return x[0], 0
	}
	mean := sum / float64(len(x))
	ss := 0.0
	for _, v := range x {
		ss += (v - mean) * (v - mean)
	}
	d := float64(len(x))
	if unbiased {
		d--
	}
	return mean, math.Sqrt(ss / d)
}

// nanless replaces NaNs (which never compare equal) so that reports can be compared.
func nanless(r *inspect.CounterfactualReport) *inspect.CounterfactualReport {
	c := *r
	c.Rows = append([]inspect.CounterfactualRow(nil), r.Rows...)
	fix := func(x *float64) {
		if math.IsNaN(*x) {
			*x = -1
		}
	}
	for i := range c.Rows {
		fix(&c.Rows[i].Measured)
		fix(&c.Rows[i].Predicted)
		fix(&c.Rows[i].AdvRatio)
	}
	fix(&c.Spearman)
	fix(&c.SpearmanAdv)
	return &c
}
