package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/drmas/drmas/pkg/jsonl"
)

// Pooling counterfactual reports (`drmas inspect-grads --pool`): the predictors against the measured
// ratio over many reports, by row and by label × agent medians. The plot: poolplot.go.

// Pooled is counterfactual reports pooled: each row labelled with its report's label, the rank
// correlations over all rows with bootstrap intervals, and each (label, agent)'s medians.
type Pooled struct {
	Labels []string
	Rows   []PooledRow
	// Correlations: each predictor's Spearman correlation with the measured ratio over the rows.
	Correlations []Correlation
	Cells        []Cell
	// CellCorrelations: the same over the cells' medians (one point per label and agent), which
	// averages out the batch-to-batch noise of the measured ratio.
	CellCorrelations []Correlation
}

// PooledRow is one row of one labelled report.
type PooledRow struct {
	Label string
	CounterfactualRow
}

// Correlation is one predictor's Spearman correlation with the measured ratio over the pooled rows.
type Correlation struct {
	Predictor string  `json:"predictor"`
	Spearman  float64 `json:"spearman"`
	Lo        float64 `json:"ci95_lo"`
	Hi        float64 `json:"ci95_hi"`
	Pairs     int     `json:"pairs"`
}

// Cell is one (label, agent): medians over its rows.
type Cell struct {
	Label     string  `json:"label"`
	Agent     string  `json:"agent"`
	Rows      int     `json:"rows"`
	Measured  float64 `json:"measured"`
	Inflation float64 `json:"inflation"`
	Energy    float64 `json:"energy"`
	Centered  float64 `json:"centered"`
	Weighted  float64 `json:"weighted"`
}

// predictors are the two statistics training logs, by name.
var predictors = []struct {
	name, title string
	of          func(CounterfactualRow) float64
}{
	{"inflation", "Lemma 4.2 inflation", func(r CounterfactualRow) float64 { return r.Predicted }},
	{"energy", "ΣA² ratio", func(r CounterfactualRow) float64 { return r.AdvRatio }},
	{"centered", "within-group ΣA² ratio", func(r CounterfactualRow) float64 { return r.CenteredRatio }},
	{"weighted", "score-weighted ΣA² ratio", func(r CounterfactualRow) float64 { return r.WeightedRatio }},
}

// Pool pools labelled reports (labels[i] names reps[i]).
func Pool(labels []string, reps []*CounterfactualReport) *Pooled {
	p := &Pooled{Labels: labels}
	for i, r := range reps {
		for _, row := range r.Rows {
			p.Rows = append(p.Rows, PooledRow{labels[i], row})
		}
	}
	plain := make([]CounterfactualRow, len(p.Rows))
	for i, r := range p.Rows {
		plain[i] = r.CounterfactualRow
	}
	for _, pr := range predictors {
		xs, ys := pairs(plain, pr.of)
		p.Correlations = append(p.Correlations, correlate(pr.name, xs, ys))
	}
	type key struct{ label, agent string }
	var order []key
	cells := map[key][]CounterfactualRow{}
	for _, r := range p.Rows {
		k := key{r.Label, r.Agent}
		if _, ok := cells[k]; !ok {
			order = append(order, k)
		}
		cells[k] = append(cells[k], r.CounterfactualRow)
	}
	for _, k := range order {
		c := Cell{Label: k.label, Agent: k.agent, Rows: len(cells[k])}
		med := func(f func(CounterfactualRow) float64) float64 {
			var xs []float64
			for _, r := range cells[k] {
				if v := f(r); !math.IsNaN(v) {
					xs = append(xs, v)
				}
			}
			return median(xs)
		}
		c.Measured = med(func(r CounterfactualRow) float64 { return r.Measured })
		c.Inflation, c.Energy = med(predictors[0].of), med(predictors[1].of)
		c.Centered, c.Weighted = med(predictors[2].of), med(predictors[3].of)
		p.Cells = append(p.Cells, c)
	}
	for i, pr := range predictors {
		var xs, ys []float64
		for _, c := range p.Cells {
			if x := []float64{c.Inflation, c.Energy, c.Centered, c.Weighted}[i]; !math.IsNaN(x) && !math.IsNaN(c.Measured) {
				xs, ys = append(xs, x), append(ys, c.Measured)
			}
		}
		p.CellCorrelations = append(p.CellCorrelations, correlate(pr.name, xs, ys))
	}
	return p
}

// correlate is a predictor's Spearman correlation with its 95% bootstrap interval.
func correlate(name string, xs, ys []float64) Correlation {
	lo, hi := SpearmanCI(xs, ys, 0.95, 2000)
	return Correlation{Predictor: name, Spearman: Spearman(xs, ys), Lo: lo, Hi: hi, Pairs: len(xs)}
}

// WriteTable prints the cells and the correlations.
func (p *Pooled) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "label\tagent\trows\tmedian measured\tmedian inflation\tmedian ΣA² ratio\tmedian within-group\tmedian score-weighted\t\n")
	for _, c := range p.Cells {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", c.Label, c.Agent, c.Rows, fmtRatio(c.Measured), fmtRatio(c.Inflation),
			fmtRatio(c.Energy), fmtRatio(c.Centered), fmtRatio(c.Weighted))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, set := range []struct {
		what  string
		corrs []Correlation
	}{{"rows", p.Correlations}, {"cells (label × agent medians)", p.CellCorrelations}} {
		for _, c := range set.corrs {
			if _, err := fmt.Fprintf(w, "Spearman (measured vs %s) over %d %s: %.3f [95%% bootstrap CI %.3f, %.3f]\n",
				c.Predictor, c.Pairs, set.what, c.Spearman, c.Lo, c.Hi); err != nil {
				return err
			}
		}
	}
	return nil
}

// MarshalJSON writes the cells and correlations (non-finite figures as null; an infinite median is
// flagged by its *_infinite field).
func (p *Pooled) MarshalJSON() ([]byte, error) {
	type cell struct {
		Label            string    `json:"label"`
		Agent            string    `json:"agent"`
		Rows             int       `json:"rows"`
		Measured         jsonl.Num `json:"measured"`
		MeasuredInfinite bool      `json:"measured_infinite"`
		Inflation        jsonl.Num `json:"inflation"`
		Energy           jsonl.Num `json:"energy"`
		EnergyInfinite   bool      `json:"energy_infinite"`
		Centered         jsonl.Num `json:"centered"`
		CenteredInfinite bool      `json:"centered_infinite"`
		Weighted         jsonl.Num `json:"weighted"`
		WeightedInfinite bool      `json:"weighted_infinite"`
	}
	type corr struct {
		Predictor string    `json:"predictor"`
		Spearman  jsonl.Num `json:"spearman"`
		Lo        jsonl.Num `json:"ci95_lo"`
		Hi        jsonl.Num `json:"ci95_hi"`
		Pairs     int       `json:"pairs"`
	}
	var out struct {
		Labels           []string `json:"labels"`
		Cells            []cell   `json:"cells"`
		Correlations     []corr   `json:"correlations"`
		CellCorrelations []corr   `json:"cell_correlations"`
	}
	out.Labels = p.Labels
	for _, c := range p.Cells {
		out.Cells = append(out.Cells, cell{c.Label, c.Agent, c.Rows, jsonl.Num(c.Measured), math.IsInf(c.Measured, 1),
			jsonl.Num(c.Inflation), jsonl.Num(c.Energy), math.IsInf(c.Energy, 1), jsonl.Num(c.Centered), math.IsInf(c.Centered, 1),
			jsonl.Num(c.Weighted), math.IsInf(c.Weighted, 1)})
	}
	for _, c := range p.Correlations {
		out.Correlations = append(out.Correlations, corr{c.Predictor, jsonl.Num(c.Spearman), jsonl.Num(c.Lo), jsonl.Num(c.Hi), c.Pairs})
	}
	for _, c := range p.CellCorrelations {
		out.CellCorrelations = append(out.CellCorrelations, corr{c.Predictor, jsonl.Num(c.Spearman), jsonl.Num(c.Lo), jsonl.Num(c.Hi), c.Pairs})
	}
	return json.Marshal(out)
}
