package normalize

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

// diagGolden is testdata/diag_golden.json, written by testdata/diag_golden.py from the reference
// code's own functions (langfengQ/DrMAS core_algos.py) on fixed random batches.
type diagGolden struct {
	Cases []struct {
		Samples []Sample `json:"samples"`
		DrMAS   refOut   `json:"drmas"`
		NoStd   refOut   `json:"no_std"`
	} `json:"cases"`
	AdaptiveKL []struct {
		Init    float64 `json:"init"`
		Target  float64 `json:"target"`
		Horizon float64 `json:"horizon"`
		Steps   []struct {
			KL     float64 `json:"kl"`
			NSteps int     `json:"n_steps"`
			Value  float64 `json:"value"`
		} `json:"steps"`
	} `json:"adaptive_kl"`
}

type refOut struct {
	Advantages  []float64          `json:"advantages"`
	Metrics     map[string]float64 `json:"metrics"`
	LossWeights []float64          `json:"loss_weights"`
}

func readDiagGolden(t *testing.T) diagGolden {
	t.Helper()
	b, err := os.ReadFile("testdata/diag_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g diagGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("no cases")
	}
	return g
}

// refKeys are the reference's metric names of d's figures (its agent in the middle, as it logs them).
func refKeys(d AgentDiag) map[string]float64 {
	a := d.Agent
	m := map[string]float64{
		"adv_diag/" + a + "/mean_gap_mean":         d.MeanGapMean,
		"adv_diag/" + a + "/mean_gap_abs_mean":     d.MeanGapAbsMean,
		"adv_diag/" + a + "/mean_gap_abs_max":      d.MeanGapAbsMax,
		"adv_diag/" + a + "/var_ratio_mean":        d.VarRatioMean,
		"adv_diag/" + a + "/var_ratio_min":         d.VarRatioMin,
		"adv_diag/" + a + "/var_ratio_max":         d.VarRatioMax,
		"adv_diag/" + a + "/inflation_factor_mean": d.InflationMean,
		"adv_diag/" + a + "/inflation_factor_p95":  d.InflationP95,
		"adv_diag/" + a + "/inflation_factor_max":  d.InflationMax,
		"adv_std/" + a + "/mean":                   d.StdMean,
		"adv_std/" + a + "/min":                    d.StdMin,
		"adv_std/" + a + "/p5":                     d.StdP5,
		"adv_std/" + a + "/median":                 d.StdMedian,
		"adv_std/" + a + "/max":                    d.StdMax,
		"adv_std/" + a + "/num_groups":             float64(d.Groups),
		"adv_norm/" + a + "/abs_mean":              d.AbsAdvMean,
		"adv_norm/" + a + "/abs_p99":               d.AbsAdvP99,
		"adv_norm/" + a + "/abs_max":               d.AbsAdvMax,
	}
	for j, th := range StdThresholds {
		m[fmt.Sprintf("adv_std/%s/frac_below_%g", a, th)] = d.StdFracBelow[j]
	}
	return m
}

func close9(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// checkDiag compares Diagnose's figures with the reference's metrics, key by key, both ways (every
// reference key but group_size_mean is produced).
func checkDiag(t *testing.T, name string, got []AgentDiag, want map[string]float64) {
	t.Helper()
	seen := 0
	for _, d := range got {
		for k, v := range refKeys(d) {
			w, ok := want[k]
			if !ok {
				t.Errorf("%s: %s: not in the reference's metrics", name, k)
				continue
			}
			seen++
			if !close9(v, w) {
				t.Errorf("%s: %s = %.17g, reference %.17g", name, k, v, w)
			}
		}
	}
	wantN := 0
	for k := range want {
		if !matchSuffix(k, "/group_size_mean") {
			wantN++
		}
	}
	if seen != wantN {
		t.Errorf("%s: %d figures compared, the reference has %d", name, seen, wantN)
	}
}

func matchSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// The diagnostics, the loss-balance weights and the advantages of Dr. MAS and of Dr. MAS without σ
// (role-baseline) equal the reference code's own on the golden batches (float64, 1e-9).
func TestDiagnosticsMatchReferenceGolden(t *testing.T) {
	g := readDiagGolden(t)
	for i, c := range g.Cases {
		name := fmt.Sprintf("case %d", i)
		for _, arm := range []struct {
			opt Options
			ref refOut
			tag string
		}{{DrMAS(), c.DrMAS, "drmas"}, {RoleBaseline(), c.NoStd, "no-std"}} {
			res, err := ComputeResolved(c.Samples, arm.opt)
			if err != nil {
				t.Fatal(err)
			}
			for j, a := range res.Advantages {
				if !close9(a, arm.ref.Advantages[j]) {
					t.Fatalf("%s %s: advantage %d = %.17g, reference %.17g", name, arm.tag, j, a, arm.ref.Advantages[j])
				}
			}
			checkDiag(t, name+" "+arm.tag, Diagnose(c.Samples, res.Advantages), arm.ref.Metrics)
			if !slices.EqualFunc(res.Diagnostics, Diagnose(c.Samples, res.Advantages), func(p, q AgentDiag) bool { return fmt.Sprint(p) == fmt.Sprint(q) }) {
				t.Errorf("%s %s: ComputeResolved's diagnostics differ from Diagnose's", name, arm.tag)
			}
		}
		w := LossBalanceWeights(c.Samples)
		for j := range w {
			if !close9(w[j], c.DrMAS.LossWeights[j]) {
				t.Fatalf("%s: loss weight %d = %.17g, reference %.17g", name, j, w[j], c.DrMAS.LossWeights[j])
			}
		}
	}
}

// The adaptive KL controller's coefficients equal the reference's AdaptiveKLController's.
func TestAdaptiveKLMatchesReferenceGolden(t *testing.T) {
	for i, tr := range readDiagGolden(t).AdaptiveKL {
		c := AdaptiveKL{Coef: tr.Init, Target: tr.Target, Horizon: tr.Horizon}
		for j, st := range tr.Steps {
			c.Update(st.KL, st.NSteps)
			if !close9(c.Coef, st.Value) {
				t.Fatalf("trace %d step %d: coef %.17g, reference %.17g", i, j, c.Coef, st.Value)
			}
		}
	}
}

// refDiagTranscribed is a line-by-line Go transcription of the reference's
// _compute_global_uid_stats, _compute_per_agent_stats, summarize_group_diagnostics,
// summarize_group_std_stats (Dr. MAS grouping) and the adv_norm figures, keyed as the reference logs
// them: a second implementation, independent of Diagnose's.
func refDiagTranscribed(samples []Sample, adv []float64) map[string]float64 {
	type tk struct{ u, t string }
	type ak struct{ u, a string }
	trajAcc, trajOrder := map[tk][]float64{}, []tk{}
	for _, x := range samples {
		k := tk{x.UID, x.TrajUID}
		if _, ok := trajAcc[k]; !ok {
			trajOrder = append(trajOrder, k)
		}
		trajAcc[k] = append(trajAcc[k], x.Score)
	}
	id2score := map[string][]float64{}
	for _, k := range trajOrder {
		id2score[k.u] = append(id2score[k.u], mean(trajAcc[k]))
	}
	stat := func(v []float64) (float64, float64) {
		if len(v) == 1 {
			return 0, 1
		}
		m := mean(v)
		var ss float64
		for _, x := range v {
			ss += (x - m) * (x - m)
		}
		return m, math.Sqrt(ss / float64(len(v)-1))
	}
	agentScores, agentOrder := map[ak][]float64{}, []ak{}
	for _, x := range samples {
		k := ak{x.UID, x.Agent}
		if _, ok := agentScores[k]; !ok {
			agentOrder = append(agentOrder, k)
		}
		agentScores[k] = append(agentScores[k], x.Score)
	}
	gap, vr, inf, stds := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for _, k := range agentOrder {
		muK, sK := stat(agentScores[k])
		mu, s := stat(id2score[k.u])
		g := muK - mu
		gap[k.a] = append(gap[k.a], g)
		vr[k.a] = append(vr[k.a], (sK*sK)/(s*s+1e-12))
		inf[k.a] = append(inf[k.a], (sK*sK+g*g)/(s*s+1e-12))
		stds[k.a] = append(stds[k.a], sK)
	}
	m := map[string]float64{}
	abs := func(v []float64) []float64 {
		o := make([]float64, len(v))
		for i, x := range v {
			o[i] = math.Abs(x)
		}
		return o
	}
	for a := range gap {
		p := "adv_diag/" + a + "/"
		m[p+"mean_gap_mean"], m[p+"mean_gap_abs_mean"], m[p+"mean_gap_abs_max"] = mean(gap[a]), mean(abs(gap[a])), slices.Max(abs(gap[a]))
		m[p+"var_ratio_mean"], m[p+"var_ratio_min"], m[p+"var_ratio_max"] = mean(vr[a]), slices.Min(vr[a]), slices.Max(vr[a])
		m[p+"inflation_factor_mean"], m[p+"inflation_factor_p95"], m[p+"inflation_factor_max"] = mean(inf[a]), npPercentile(inf[a], 95), slices.Max(inf[a])
		q := "adv_std/" + a + "/"
		m[q+"mean"], m[q+"min"], m[q+"p5"], m[q+"median"], m[q+"max"] = mean(stds[a]), slices.Min(stds[a]), npPercentile(stds[a], 5), npPercentile(stds[a], 50), slices.Max(stds[a])
		m[q+"num_groups"], m[q+"group_size_mean"] = float64(len(stds[a])), 0
		for _, th := range []float64{1e-3, 1e-2, 1e-1} {
			n := 0
			for _, s := range stds[a] {
				if s < th {
					n++
				}
			}
			m[fmt.Sprintf("%sfrac_below_%g", q, th)] = float64(n) / float64(len(stds[a]))
		}
	}
	absAdv := map[string][]float64{}
	for i, x := range samples {
		absAdv[x.Agent] = append(absAdv[x.Agent], math.Abs(adv[i]))
	}
	for a, v := range absAdv {
		p := "adv_norm/" + a + "/"
		m[p+"abs_max"], m[p+"abs_p99"], m[p+"abs_mean"] = slices.Max(v), npPercentile(v, 99), mean(v)
	}
	return m
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// npPercentile is numpy's linear percentile, written as its documentation states it:
// sorted x, position (n−1)·q/100, linear interpolation.
func npPercentile(x []float64, q float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	pos := float64(len(s)-1) * q / 100
	lo := math.Floor(pos)
	hi := math.Min(lo+1, float64(len(s)-1))
	return s[int(lo)] + (s[int(hi)]-s[int(lo)])*(pos-lo)
}

// refWeightsTranscribed transcribes compute_loss_balance_weights: Counter over (uid, agent) keys,
// 1/count, divided by the mean.
func refWeightsTranscribed(samples []Sample) []float64 {
	counts := map[[2]string]int{}
	for _, x := range samples {
		counts[[2]string{x.UID, x.Agent}]++
	}
	raw := make([]float64, len(samples))
	for i, x := range samples {
		raw[i] = 1.0 / float64(counts[[2]string{x.UID, x.Agent}])
	}
	m := mean(raw)
	for i := range raw {
		raw[i] /= m
	}
	return raw
}

// On random batches with 1–4 calls per agent per trajectory, under every preset, Diagnose and
// LossBalanceWeights equal the Go transcription of the reference's functions.
func TestDiagnosticsMatchTranscription(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 2602))
	for n := range 300 {
		samples := randomBatch(r)
		for _, p := range []Options{GRPO(), DrMAS(), RoleBaseline(), GRPOCall(), ATGRPO()} {
			res, err := ComputeResolved(samples, p)
			if err != nil {
				t.Fatal(err)
			}
			want := refDiagTranscribed(samples, res.Advantages)
			for _, d := range res.Diagnostics {
				for k, v := range refKeys(d) {
					if w, ok := want[k]; !ok || !close9(v, w) {
						t.Fatalf("batch %d: %s = %.17g, transcription %.17g (%v)", n, k, v, w, ok)
					}
				}
			}
		}
		w, want := LossBalanceWeights(samples), refWeightsTranscribed(samples)
		for i := range w {
			if !close9(w[i], want[i]) {
				t.Fatalf("batch %d: weight %d = %.17g, transcription %.17g", n, i, w[i], want[i])
			}
		}
	}
}
