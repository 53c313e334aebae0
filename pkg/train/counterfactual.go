package train

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"text/tabwriter"

	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/torch"
)

// Normalizations compared by the counterfactual inspection: global GRPO, agent-wise Dr. MAS and the
// two ablation combinations of the paper's table 3.
var Normalizations = []struct {
	Name string
	Opt  normalize.Options
}{
	{"grpo", normalize.GRPO()},
	{"drmas", normalize.DrMAS()},
	{"mean-agent/std-global", withMeanStd(normalize.DrMAS(), normalize.Agent, normalize.Global)},
	{"mean-global/std-agent", withMeanStd(normalize.DrMAS(), normalize.Global, normalize.Agent)},
}

func withMeanStd(o normalize.Options, mean, std string) normalize.Options {
	o.Mean, o.Std = mean, std
	return o
}

// CounterfactualRow is one agent in one rollout batch: its gradient norm under each normalization,
// the measured ratio of squared norms (GRPO / Dr. MAS) and the Lemma 4.2 prediction of that ratio.
type CounterfactualRow struct {
	Batch     int                `json:"batch"`
	Agent     string             `json:"agent"`
	Calls     int                `json:"calls"`
	Norms     map[string]float64 `json:"norms"`
	Measured  float64            `json:"measured_ratio"`  // |g_grpo|² / |g_drmas|²
	Predicted float64            `json:"predicted_ratio"` // mean inflation factor (σ_k² + (μ_k − μ)²)/σ²
	// AdvRatio is ΣA²_grpo / ΣA²_drmas over the agent's calls: the lemma's gradient model (squared
	// norm ∝ the calls' squared advantages) applied to the advantages the two estimators actually gave,
	// std floors and trajectory averaging included.
	AdvRatio float64 `json:"advantage_ratio"`
}

// CounterfactualReport answers "would Dr. MAS help this system?" before a long run.
type CounterfactualReport struct {
	Rows     []CounterfactualRow `json:"rows"`
	Spearman float64             `json:"spearman"` // rank correlation of measured vs predicted over the rows
	Pairs    int                 `json:"pairs"`    // rows with both figures finite
	// SpearmanAdv is the rank correlation of measured vs AdvRatio, over AdvPairs rows.
	SpearmanAdv float64 `json:"spearman_advantage"`
	AdvPairs    int     `json:"pairs_advantage"`
}

// Counterfactual collects `batches` rollout batches with the team's current weights and, for each,
// computes every agent's gradient norm under each normalization of Normalizations on that same batch,
// without taking a step. Call it from an ordinary goroutine.
func Counterfactual(ctx context.Context, team *Team, batches int) (*CounterfactualReport, error) {
	cfg := team.Config
	models := newModels(cfg, team.Router)
	rep := &CounterfactualReport{}
	for b := 1; b <= batches; b++ {
		roll, _, err := team.rollout(ctx, team.Router, b)
		if err != nil {
			return nil, fmt.Errorf("batch %d: %w", b, err)
		}
		samples := roll.Samples()
		ns := normSamples(samples)
		rows := map[string]*CounterfactualRow{}
		advSq := map[string]map[string]float64{} // mode → agent → ΣA²
		for _, mode := range Normalizations {
			opt := mode.Opt
			n := cfg.Algorithm.Normalization
			opt.Eps, opt.Unbiased, opt.MinStd = n.Eps, !n.PopulationStd, n.MinStd
			res, err := normalize.Compute(ns, opt)
			if err != nil {
				return nil, err
			}
			if mode.Name == "grpo" {
				for _, a := range res.Stats.Agents {
					rows[a.Agent] = &CounterfactualRow{Batch: b, Agent: a.Agent, Calls: a.Calls, Norms: map[string]float64{}, Predicted: a.Inflation}
				}
			}
			advSq[mode.Name] = map[string]float64{}
			for i, s := range samples {
				advSq[mode.Name][s.Agent] += res.Advantages[i] * res.Advantages[i]
			}
			perModel := team.itemsByModel(roll, samples, res.Advantages)
			err = torch.Do(func() error {
				for _, ms := range models {
					norms, err := ms.agentNorms(perModel[ms.id])
					if err != nil {
						return err
					}
					for a, n := range norms {
						if r := rows[a]; r != nil {
							r.Norms[mode.Name] = n
						}
					}
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
		agents := make([]string, 0, len(rows))
		for a := range rows {
			agents = append(agents, a)
		}
		sort.Strings(agents)
		for _, a := range agents {
			r := rows[a]
			g, d := r.Norms["grpo"], r.Norms["drmas"]
			r.Measured, r.AdvRatio = math.NaN(), math.NaN()
			if d > 0 {
				r.Measured = g * g / (d * d)
			}
			if sd := advSq["drmas"][a]; sd > 0 {
				r.AdvRatio = advSq["grpo"][a] / sd
			}
			rep.Rows = append(rep.Rows, *r)
		}
	}
	rep.Spearman, rep.Pairs = rankAgainstMeasured(rep.Rows, func(r CounterfactualRow) float64 { return r.Predicted })
	rep.SpearmanAdv, rep.AdvPairs = rankAgainstMeasured(rep.Rows, func(r CounterfactualRow) float64 { return r.AdvRatio })
	return rep, nil
}

// rankAgainstMeasured is the Spearman correlation of a prediction with the measured ratio over the
// rows where both are finite, and the number of those rows.
func rankAgainstMeasured(rows []CounterfactualRow, pred func(CounterfactualRow) float64) (float64, int) {
	var xs, ys []float64
	for _, r := range rows {
		if p := pred(r); isFinite(r.Measured) && isFinite(p) {
			xs, ys = append(xs, p), append(ys, r.Measured)
		}
	}
	return Spearman(xs, ys), len(xs)
}

// agentNorms is each agent's gradient norm on its calls, measured as in an optimizer step on them
// all, without taking the step. Torch thread.
func (ms *modelState) agentNorms(items []*item) (map[string]float64, error) {
	if len(items) == 0 {
		return nil, nil
	}
	ZeroGrad(ms.params)
	defer ZeroGrad(ms.params)
	st, err := ms.backward(newMiniBatch(items, ms.horizon, true))
	if err != nil {
		return nil, err
	}
	norms := map[string]float64{}
	for _, a := range st.agents {
		norms[a.agent] = a.gradNorm
	}
	return norms, nil
}

// Spearman is the rank correlation of xs and ys (average ranks for ties); NaN with fewer than 3 pairs.
func Spearman(xs, ys []float64) float64 {
	if len(xs) < 3 || len(xs) != len(ys) {
		return math.NaN()
	}
	rx, ry := ranks(xs), ranks(ys)
	var mx, my float64
	for i := range rx {
		mx += rx[i]
		my += ry[i]
	}
	mx /= float64(len(rx))
	my /= float64(len(ry))
	var sxy, sxx, syy float64
	for i := range rx {
		dx, dy := rx[i]-mx, ry[i]-my
		sxy += dx * dy
		sxx += dx * dx
		syy += dy * dy
	}
	if sxx == 0 || syy == 0 {
		return math.NaN()
	}
	return sxy / math.Sqrt(sxx*syy)
}

func ranks(v []float64) []float64 {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return v[idx[a]] < v[idx[b]] })
	r := make([]float64, len(v))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && v[idx[j+1]] == v[idx[i]] {
			j++
		}
		avg := float64(i+j)/2 + 1
		for k := i; k <= j; k++ {
			r[idx[k]] = avg
		}
		i = j + 1
	}
	return r
}

// WriteTable prints the per-batch rows and the per-agent means with the rank correlation.
func (r *CounterfactualReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "batch\tagent\tcalls\t")
	for _, n := range Normalizations {
		fmt.Fprintf(tw, "|g| %s\t", n.Name)
	}
	fmt.Fprint(tw, "measured |g_grpo|²/|g_drmas|²\tpredicted inflation\tΣA²_grpo/ΣA²_drmas\t\n")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%d\t%s\t%d\t", row.Batch, row.Agent, row.Calls)
		for _, n := range Normalizations {
			fmt.Fprintf(tw, "%.4g\t", row.Norms[n.Name])
		}
		fmt.Fprintf(tw, "%.4g\t%.4g\t%.4g\t\n", row.Measured, row.Predicted, row.AdvRatio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nSpearman rank correlation (measured vs predicted) over %d agent-batches: %.3f\n"+
		"Spearman rank correlation (measured vs ΣA² ratio) over %d agent-batches: %.3f\n", r.Pairs, r.Spearman, r.AdvPairs, r.SpearmanAdv)
	return err
}

// MarshalJSON writes non-finite figures (undefined ratios) as null.
func (r *CounterfactualReport) MarshalJSON() ([]byte, error) {
	num := func(x float64) *float64 {
		if !isFinite(x) {
			return nil
		}
		return &x
	}
	type row struct {
		Batch     int                 `json:"batch"`
		Agent     string              `json:"agent"`
		Calls     int                 `json:"calls"`
		Norms     map[string]*float64 `json:"norms"`
		Measured  *float64            `json:"measured_ratio"`
		Predicted *float64            `json:"predicted_ratio"`
		AdvRatio  *float64            `json:"advantage_ratio"`
	}
	out := struct {
		Rows        []row    `json:"rows"`
		Spearman    *float64 `json:"spearman"`
		Pairs       int      `json:"pairs"`
		SpearmanAdv *float64 `json:"spearman_advantage"`
		AdvPairs    int      `json:"pairs_advantage"`
	}{Spearman: num(r.Spearman), Pairs: r.Pairs, SpearmanAdv: num(r.SpearmanAdv), AdvPairs: r.AdvPairs, Rows: []row{}}
	for _, x := range r.Rows {
		nr := row{Batch: x.Batch, Agent: x.Agent, Calls: x.Calls, Norms: map[string]*float64{}, Measured: num(x.Measured),
			Predicted: num(x.Predicted), AdvRatio: num(x.AdvRatio)}
		for k, v := range x.Norms {
			nr.Norms[k] = num(v)
		}
		out.Rows = append(out.Rows, nr)
	}
	return json.Marshal(out)
}
