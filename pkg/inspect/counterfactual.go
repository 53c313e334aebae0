package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"text/tabwriter"

	"github.com/drmas/drmas/pkg/jsonl"
)

// The counterfactual inspection (`drmas inspect-grads --config`): on the same rollout batches, each
// agent's gradient norm under global GRPO and agent-wise Dr. MAS, the measured ratio of squared norms
// and the two logged statistics that predict it. pkg/train measures; this file holds the report, its
// verdict and the pooling of reports (`drmas inspect-grads --counterfactuals`).

// CounterfactualRow is one agent in one rollout batch: its gradient norm under each normalization,
// the measured ratio of squared norms (GRPO / Dr. MAS) and the two predictions of that ratio.
type CounterfactualRow struct {
	Batch int                `json:"batch"`
	Agent string             `json:"agent"`
	Calls int                `json:"calls"`
	Norms map[string]float64 `json:"norms"`
	// Energy holds, under "grpo" and "drmas", ΣA² over the agent's calls, and with the suffixes
	// Centered and Weighted its within-group part and its score-weighted form (see CenteredRatio and
	// WeightedRatio).
	Energy map[string]float64 `json:"energy"`
	// Measured is |g_grpo|² / |g_drmas|²: +Inf where Dr. MAS gives the agent no gradient and GRPO does
	// (its scores did not vary within the batch's groups), NaN where neither does.
	Measured float64 `json:"measured_ratio"`
	// Predicted is the mean Lemma 4.2 inflation factor (σ_k² + (μ_k − μ)²)/σ² (`inflation/agent/<a>`).
	Predicted float64 `json:"predicted_ratio"`
	// AdvRatio is ΣA²_grpo / ΣA²_drmas (`adv_energy_ratio/agent/<a>`): the lemma's gradient model
	// (squared norm ∝ the calls' squared advantages) applied to the advantages the two estimators
	// actually gave, std floors and trajectory averaging included. +Inf and NaN as for Measured.
	AdvRatio float64 `json:"advantage_ratio"`
	// CenteredRatio is AdvRatio over the part of the advantages that varies among the agent's calls of
	// a group, Σ(A − Ā_group,agent)²: the shift (μ_k − μ) that GRPO adds to every call of the agent is
	// left out, since a constant advantage times a score function whose mean is zero averages away.
	CenteredRatio float64 `json:"centered_ratio"`
	// WeightedRatio is AdvRatio with each call's A² weighted by Σ_t (1 − p_t)² over its sampled tokens
	// (how much the call's score function can weigh in the gradient).
	WeightedRatio float64 `json:"weighted_ratio"`
}

// Energy keys' suffixes (CounterfactualRow.Energy).
const (
	Centered = "/centered"
	Weighted = "/weighted"
)

// Ratio is num/den for the ratios of the report: +Inf when den is 0 and num is not, NaN when both are
// 0 or either is NaN.
func Ratio(num, den float64) float64 {
	switch {
	case math.IsNaN(num) || math.IsNaN(den) || num == 0 && den == 0:
		return math.NaN()
	case den == 0:
		return math.Inf(1)
	}
	return num / den
}

// Fill sets Measured and AdvRatio from the norms and energies.
func (r *CounterfactualRow) Fill() {
	g, d := r.Norms["grpo"], r.Norms["drmas"]
	r.Measured = Ratio(g*g, d*d)
	r.AdvRatio = Ratio(r.Energy["grpo"], r.Energy["drmas"])
	r.CenteredRatio = Ratio(r.Energy["grpo"+Centered], r.Energy["drmas"+Centered])
	r.WeightedRatio = Ratio(r.Energy["grpo"+Weighted], r.Energy["drmas"+Weighted])
}

// CounterfactualReport answers "would Dr. MAS help this system?" before a long run.
type CounterfactualReport struct {
	Rows     []CounterfactualRow `json:"rows"`
	Spearman float64             `json:"spearman"` // rank correlation of measured vs predicted over the rows
	Pairs    int                 `json:"pairs"`    // rows with neither figure NaN
	// SpearmanAdv is the rank correlation of measured vs AdvRatio, over AdvPairs rows.
	SpearmanAdv float64 `json:"spearman_advantage"`
	AdvPairs    int     `json:"pairs_advantage"`
}

// Correlate sets the rank correlations from the rows. A ratio of +Inf ranks above every finite one.
func (r *CounterfactualReport) Correlate() {
	r.Spearman, r.Pairs = rankAgainstMeasured(r.Rows, func(c CounterfactualRow) float64 { return c.Predicted })
	r.SpearmanAdv, r.AdvPairs = rankAgainstMeasured(r.Rows, func(c CounterfactualRow) float64 { return c.AdvRatio })
}

func rankAgainstMeasured(rows []CounterfactualRow, pred func(CounterfactualRow) float64) (float64, int) {
	xs, ys := pairs(rows, pred)
	return Spearman(xs, ys), len(xs)
}

// pairs lists (prediction, measured) over the rows where neither is NaN.
func pairs(rows []CounterfactualRow, pred func(CounterfactualRow) float64) (xs, ys []float64) {
	for _, r := range rows {
		if p := pred(r); !math.IsNaN(r.Measured) && !math.IsNaN(p) {
			xs, ys = append(xs, p), append(ys, r.Measured)
		}
	}
	return xs, ys
}

// Spearman is the rank correlation of xs and ys (average ranks for ties, +Inf above every finite
// value); NaN with fewer than 3 pairs or a constant side.
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

// SpearmanCI is the percentile bootstrap interval (level, e.g. 0.95) of the Spearman correlation of
// the pairs, over `resamples` resamples of the pairs drawn with a fixed seed (so a report repeats).
func SpearmanCI(xs, ys []float64, level float64, resamples int) (lo, hi float64) {
	if len(xs) < 3 {
		return math.NaN(), math.NaN()
	}
	rng := rand.New(rand.NewPCG(0x5ea, uint64(len(xs))))
	var rhos []float64
	bx, by := make([]float64, len(xs)), make([]float64, len(ys))
	for range resamples {
		for i := range bx {
			k := rng.IntN(len(xs))
			bx[i], by[i] = xs[k], ys[k]
		}
		if r := Spearman(bx, by); !math.IsNaN(r) {
			rhos = append(rhos, r)
		}
	}
	if len(rhos) == 0 {
		return math.NaN(), math.NaN()
	}
	slices.Sort(rhos)
	q := func(p float64) float64 { return rhos[min(len(rhos)-1, int(p*float64(len(rhos))))] }
	return q((1 - level) / 2), q((1 + level) / 2)
}

// The verdict's thresholds on the advantage energy ratio ΣA²_grpo/ΣA²_drmas, and their evidence
// (docs/dial.md, the dial study: 5 dial settings × one model per agent and shared × 5 seeds). Where
// the dialled agent's median ratio was at least MattersAbove, GRPO's pre-clip gradient norms for it
// exceeded Dr. MAS's by more than 2 standard errors in both layouts; between MayMatterAbove and
// MattersAbove, in one layout of the two; below MayMatterAbove, in neither. Over training, the
// logged ratio ranked the settings' squared-norm inflation with Spearman 0.90.
const (
	MattersAbove   = 2.0
	MayMatterAbove = 1.2
	verdictSource  = "thresholds from the dial study, docs/dial.md"
)

// Verdict levels.
const (
	Matters       = "matters"
	MayMatter     = "may matter"
	DoesNotMatter = "does not matter"
)

// Verdict is the plain answer for one agent: by how much GRPO would scale its squared gradient
// (the median advantage energy ratio, the lemma's model of that scale) and whether Dr. MAS is
// expected to matter for it.
type Verdict struct {
	Agent    string  `json:"agent"`
	Batches  int     `json:"batches"`  // batches with a defined energy ratio
	Scale    float64 `json:"scale"`    // median ΣA²_grpo/ΣA²_drmas (+Inf: Dr. MAS gives the agent no advantage)
	Measured float64 `json:"measured"` // median measured |g_grpo|²/|g_drmas|² on the same batches
	Level    string  `json:"level"`    // Matters, MayMatter or DoesNotMatter; "" without a defined ratio
	Text     string  `json:"text"`
}

// Judge gives the verdict for an agent whose energy ratio is scale (measured: the measured ratio of
// squared norms, NaN when unknown, as in a training run's logs).
func Judge(agent string, scale, measured float64) Verdict {
	v := Verdict{Agent: agent, Scale: scale, Measured: measured}
	if math.IsNaN(scale) {
		v.Text = fmt.Sprintf("%s: no batch gave this agent advantages under either estimator; no verdict", agent)
		return v
	}
	switch {
	case scale >= MattersAbove:
		v.Level = Matters
	case scale >= MayMatterAbove:
		v.Level = MayMatter
	default:
		v.Level = DoesNotMatter
	}
	what := map[string]string{Matters: "Dr. MAS expected to matter", MayMatter: "Dr. MAS may matter (borderline)",
		DoesNotMatter: "Dr. MAS not expected to matter"}[v.Level]
	by := "≈ " + fmtRatio(scale)
	if math.IsInf(scale, 1) {
		by = "an unbounded factor (Dr. MAS gives it no advantage: its scores do not vary within its groups)"
	}
	v.Text = fmt.Sprintf("%s: GRPO would scale this agent's squared gradient by %s: %s", agent, by, what)
	if !math.IsNaN(measured) {
		v.Text += fmt.Sprintf(" (measured on these batches: %s)", fmtRatio(measured))
	}
	return v
}

// Verdicts gives one verdict per agent, in the rows' order of first appearance.
func (r *CounterfactualReport) Verdicts() []Verdict {
	var order []string
	by := map[string][]CounterfactualRow{}
	for _, row := range r.Rows {
		if _, ok := by[row.Agent]; !ok {
			order = append(order, row.Agent)
		}
		by[row.Agent] = append(by[row.Agent], row)
	}
	var out []Verdict
	for _, a := range order {
		var ms, es []float64
		for _, row := range by[a] {
			if !math.IsNaN(row.Measured) {
				ms = append(ms, row.Measured)
			}
			if !math.IsNaN(row.AdvRatio) {
				es = append(es, row.AdvRatio)
			}
		}
		v := Judge(a, median(es), median(ms))
		v.Batches = len(es)
		out = append(out, v)
	}
	return out
}

// median of xs (+Inf sorts last); NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	if math.IsInf(s[n/2], 1) {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func fmtRatio(x float64) string {
	switch {
	case math.IsInf(x, 1):
		return "∞"
	case math.IsNaN(x):
		return "NaN"
	}
	return strconv.FormatFloat(x, 'g', 3, 64) + "×"
}

// WriteTable prints the per-batch rows, the rank correlations and the verdict per agent.
func (r *CounterfactualReport) WriteTable(w io.Writer, normalizations []string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "batch\tagent\tcalls\t")
	for _, n := range normalizations {
		fmt.Fprintf(tw, "|g| %s\t", n)
	}
	fmt.Fprint(tw, "measured |g_grpo|²/|g_drmas|²\tpredicted inflation\tΣA²_grpo/ΣA²_drmas\twithin-group\tscore-weighted\t\n")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%d\t%s\t%d\t", row.Batch, row.Agent, row.Calls)
		for _, n := range normalizations {
			fmt.Fprintf(tw, "%.4g\t", row.Norms[n])
		}
		fmt.Fprintf(tw, "%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t\n", row.Measured, row.Predicted, row.AdvRatio, row.CenteredRatio, row.WeightedRatio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nSpearman rank correlation (measured vs predicted) over %d agent-batches: %.3f\n"+
		"Spearman rank correlation (measured vs ΣA² ratio) over %d agent-batches: %.3f\n", r.Pairs, r.Spearman, r.AdvPairs, r.SpearmanAdv)
	fmt.Fprintf(w, "\nVerdict (median ΣA² ratio: ≥ %s matters, ≥ %s may matter; %s):\n", fmtRatio(MattersAbove), fmtRatio(MayMatterAbove), verdictSource)
	for _, v := range r.Verdicts() {
		if _, err := fmt.Fprintf(w, "  %s\n", v.Text); err != nil {
			return err
		}
	}
	return nil
}

// reportJSON is the report as written: undefined and infinite figures as null (jsonl.Num); a reader
// recovers them from the norms and energies (Fill).
type reportJSON struct {
	Rows        []rowJSON     `json:"rows"`
	Spearman    jsonl.Num     `json:"spearman"`
	Pairs       int           `json:"pairs"`
	SpearmanAdv jsonl.Num     `json:"spearman_advantage"`
	AdvPairs    int           `json:"pairs_advantage"`
	Verdicts    []verdictJSON `json:"verdicts"`
	Thresholds  [2]float64    `json:"thresholds"` // MayMatterAbove, MattersAbove
}

type rowJSON struct {
	Batch     int                  `json:"batch"`
	Agent     string               `json:"agent"`
	Calls     int                  `json:"calls"`
	Norms     map[string]jsonl.Num `json:"norms"`
	Energy    map[string]jsonl.Num `json:"energy"`
	Measured  jsonl.Num            `json:"measured_ratio"`
	Predicted jsonl.Num            `json:"predicted_ratio"`
	AdvRatio  jsonl.Num            `json:"advantage_ratio"`
	Centered  jsonl.Num            `json:"centered_ratio"`
	Weighted  jsonl.Num            `json:"weighted_ratio"`
}

type verdictJSON struct {
	Agent    string    `json:"agent"`
	Batches  int       `json:"batches"`
	Scale    jsonl.Num `json:"scale"`
	Infinite bool      `json:"infinite"` // Scale is +Inf (written as null)
	Measured jsonl.Num `json:"measured"`
	Level    string    `json:"level"`
	Text     string    `json:"text"`
}

func nums(m map[string]float64) map[string]jsonl.Num {
	out := map[string]jsonl.Num{}
	for k, v := range m {
		out[k] = jsonl.Num(v)
	}
	return out
}

// MarshalJSON writes the report with its verdicts.
func (r *CounterfactualReport) MarshalJSON() ([]byte, error) {
	out := reportJSON{Spearman: jsonl.Num(r.Spearman), Pairs: r.Pairs, SpearmanAdv: jsonl.Num(r.SpearmanAdv), AdvPairs: r.AdvPairs,
		Rows: []rowJSON{}, Thresholds: [2]float64{MayMatterAbove, MattersAbove}}
	for _, x := range r.Rows {
		out.Rows = append(out.Rows, rowJSON{Batch: x.Batch, Agent: x.Agent, Calls: x.Calls, Norms: nums(x.Norms), Energy: nums(x.Energy),
			Measured: jsonl.Num(x.Measured), Predicted: jsonl.Num(x.Predicted), AdvRatio: jsonl.Num(x.AdvRatio),
			Centered: jsonl.Num(x.CenteredRatio), Weighted: jsonl.Num(x.WeightedRatio)})
	}
	for _, v := range r.Verdicts() {
		out.Verdicts = append(out.Verdicts, verdictJSON{Agent: v.Agent, Batches: v.Batches, Scale: jsonl.Num(v.Scale),
			Infinite: math.IsInf(v.Scale, 1), Measured: jsonl.Num(v.Measured), Level: v.Level, Text: v.Text})
	}
	return json.Marshal(out)
}

// ReadCounterfactual reads a report written by `drmas inspect-grads --config … --json`; the ratios are
// recomputed from the norms and energies (so +Inf survives the file's nulls).
func ReadCounterfactual(path string) (*CounterfactualReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in struct {
		Rows []struct {
			Batch     int                 `json:"batch"`
			Agent     string              `json:"agent"`
			Calls     int                 `json:"calls"`
			Norms     map[string]*float64 `json:"norms"`
			Energy    map[string]*float64 `json:"energy"`
			Predicted *float64            `json:"predicted_ratio"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("%s: not a counterfactual report (drmas inspect-grads --config … --json): %w", path, err)
	}
	if in.Rows == nil {
		return nil, fmt.Errorf("%s: not a counterfactual report (no \"rows\")", path)
	}
	val := func(p *float64) float64 {
		if p == nil {
			return math.NaN()
		}
		return *p
	}
	rep := &CounterfactualReport{}
	for i, x := range in.Rows {
		if x.Agent == "" || x.Norms == nil {
			return nil, fmt.Errorf("%s: rows[%d]: no agent or norms", path, i)
		}
		if x.Energy == nil {
			return nil, fmt.Errorf("%s: rows[%d]: no energies (a report from a drmas before the dial study: rerun it)", path, i)
		}
		row := CounterfactualRow{Batch: x.Batch, Agent: x.Agent, Calls: x.Calls, Norms: map[string]float64{},
			Energy: map[string]float64{}, Predicted: val(x.Predicted)}
		for k, v := range x.Norms {
			row.Norms[k] = val(v)
		}
		for k, v := range x.Energy {
			row.Energy[k] = val(v)
		}
		row.Fill()
		rep.Rows = append(rep.Rows, row)
	}
	rep.Correlate()
	return rep, nil
}
