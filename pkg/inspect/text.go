package inspect

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// WriteText writes the report as aligned tables: one per run (its agents, then its models) and, with two
// runs or more, a side-by-side comparison per agent and per model (rows = name × metric, columns = runs;
// with exactly two runs a last column gives first/second).
func (r *Report) WriteText(w io.Writer) error {
	tw := &textWriter{w: w}
	tw.printf("pre-clip gradient norms; spike = norm > %s × median of the previous %d finite norms",
		fnum(r.Factor), r.Window)
	if r.MinNorm > 0 {
		tw.printf(" and > %s", fnum(r.MinNorm))
	}
	tw.printf("\n")
	for _, run := range r.Runs {
		tw.printf("\n")
		tw.run(run)
	}
	if len(r.Runs) >= 2 {
		tw.printf("\n")
		tw.comparison(r.Runs)
	}
	return tw.err
}

type textWriter struct {
	w   io.Writer
	err error
}

func (tw *textWriter) printf(format string, args ...any) {
	if tw.err == nil {
		_, tw.err = fmt.Fprintf(tw.w, format, args...)
	}
}

func (tw *textWriter) run(s RunSummary) {
	tw.printf("run %s: %s", s.Label, s.File)
	if s.Normalization != "" {
		tw.printf(" (normalization %s)", s.Normalization)
	}
	tw.printf("\n  %d rows", s.Rows)
	if s.Rows > 0 {
		tw.printf(", steps %d–%d", s.FirstStep, s.LastStep)
	}
	tw.printf("; %s", plural(s.Spikes, "spike"))
	if s.MalformedLines > 0 {
		tw.printf("; %s skipped", plural(s.MalformedLines, "malformed line"))
	}
	if s.DuplicateSteps > 0 {
		tw.printf("; %s (kept the last row of each)", plural(s.DuplicateSteps, "duplicate step"))
	}
	tw.printf("\n")
	if len(s.Agents) > 0 {
		t := table{header: []string{"agent", "model", "points", "median", "p95", "max", "spikes", "non-finite", "skipped", "inflation", "energy_ratio"}, left: 2}
		for _, a := range s.Agents {
			t.add(a.Name, orDash(a.Model), itoa(a.Points), num(a.Median), num(a.P95), num(a.Max),
				itoa(a.Spikes), itoa(a.NonFinite), intPtr(a.SkippedSteps), num(a.Inflation), num(a.EnergyRatio))
		}
		tw.table(t)
		tw.sigma(s.Agents)
		for i, a := range s.Agents {
			if a.Verdict == "" {
				continue
			}
			if i == 0 || s.Agents[i-1].Verdict == "" {
				tw.printf("  verdict (mean logged ΣA² ratio; %s):\n", verdictSource)
			}
			tw.printf("    %s\n", a.Verdict)
		}
	}
	if len(s.Models) > 0 {
		t := table{header: []string{"model", "points", "median", "p95", "max", "spikes", "non-finite", "skipped"}, left: 1}
		for _, m := range s.Models {
			t.add(m.Name, itoa(m.Points), num(m.Median), num(m.P95), num(m.Max),
				itoa(m.Spikes), itoa(m.NonFinite), itoa(m.SkippedSteps))
		}
		tw.table(t)
	}
	if len(s.Agents) == 0 && len(s.Models) == 0 {
		tw.printf("  no grad_norm/agent/* or grad_norm/model/* keys\n")
	}
}

// normStat is one row of the comparison: a name and how to read it from a series' summary.
type normStat struct {
	name  string
	value func(Norms) float64 // NaN = no value
}

var normMetrics = []normStat{
	{"median", func(n Norms) float64 { return float64(n.Median) }},
	{"p95", func(n Norms) float64 { return float64(n.P95) }},
	{"max", func(n Norms) float64 { return float64(n.Max) }},
	{"spikes", func(n Norms) float64 { return float64(n.Spikes) }},
	{"non-finite", func(n Norms) float64 { return float64(n.NonFinite) }},
}

func (tw *textWriter) comparison(runs []RunSummary) {
	header := []string{"", "metric"}
	for _, r := range runs {
		header = append(header, r.Label)
	}
	ratio := len(runs) == 2
	if ratio {
		header = append(header, runs[0].Label+"/"+runs[1].Label)
	}
	row := func(t *table, first, name string, vals []float64) {
		cells := []string{first, name}
		for _, v := range vals {
			cells = append(cells, num(Num(v)))
		}
		if ratio && name == "rows" {
			cells = append(cells, "")
		} else if ratio {
			cells = append(cells, ratioCell(vals[0], vals[1]))
		}
		t.add(cells...)
	}

	agents := table{header: append([]string{"agent"}, header[1:]...), left: 2}
	for _, name := range unionNames(runs, func(r RunSummary) []string { return agentNames(r.Agents) }) {
		found := findEach(runs, name, func(r *RunSummary) []AgentSummary { return r.Agents }, func(a *AgentSummary) string { return a.Name })
		first := name
		for _, m := range normMetrics {
			row(&agents, first, m.name, each(found, func(a *AgentSummary) float64 { return m.value(a.Norms) }))
			first = ""
		}
		row(&agents, "", "skipped", each(found, func(a *AgentSummary) float64 { return intOrNaN(a.SkippedSteps) }))
		row(&agents, "", "inflation", each(found, func(a *AgentSummary) float64 { return float64(a.Inflation) }))
		row(&agents, "", "energy_ratio", each(found, func(a *AgentSummary) float64 { return float64(a.EnergyRatio) }))
	}
	row(&agents, "(run)", "spikes", eachRun(runs, func(r RunSummary) float64 { return float64(r.Spikes) }))
	row(&agents, "", "rows", eachRun(runs, func(r RunSummary) float64 { return float64(r.Rows) }))
	tw.printf("comparison per agent\n")
	tw.table(agents)

	modelNames := unionNames(runs, func(r RunSummary) []string { return modelNames(r.Models) })
	if len(modelNames) == 0 {
		return
	}
	models := table{header: append([]string{"model"}, header[1:]...), left: 2}
	for _, name := range modelNames {
		found := findEach(runs, name, func(r *RunSummary) []ModelSummary { return r.Models }, func(m *ModelSummary) string { return m.Name })
		first := name
		for _, m := range normMetrics {
			row(&models, first, m.name, each(found, func(s *ModelSummary) float64 { return m.value(s.Norms) }))
			first = ""
		}
		row(&models, "", "skipped", each(found, func(s *ModelSummary) float64 { return float64(s.SkippedSteps) }))
	}
	tw.printf("\ncomparison per model\n")
	tw.table(models)
}

// each applies f to every non-nil element; nil (absent from that run) gives NaN.
func each[T any](xs []*T, f func(*T) float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = math.NaN()
		if x != nil {
			out[i] = f(x)
		}
	}
	return out
}

// findEach returns, per run, a pointer to its item called name (nil where the run has none).
func findEach[T any](runs []RunSummary, name string, items func(*RunSummary) []T, nameOf func(*T) string) []*T {
	out := make([]*T, len(runs))
	for i := range runs {
		xs := items(&runs[i])
		for j := range xs {
			if nameOf(&xs[j]) == name {
				out[i] = &xs[j]
			}
		}
	}
	return out
}

func eachRun(runs []RunSummary, f func(RunSummary) float64) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = f(r)
	}
	return out
}

func unionNames(runs []RunSummary, names func(RunSummary) []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range runs {
		for _, n := range names(r) {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out
}

func agentNames(as []AgentSummary) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Name)
	}
	return out
}

func modelNames(ms []ModelSummary) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// table is a text table: the first `left` columns are left-aligned, the others right-aligned.
type table struct {
	header []string
	rows   [][]string
	left   int
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (tw *textWriter) table(t table) {
	width := make([]int, len(t.header))
	for _, r := range append([][]string{t.header}, t.rows...) {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range append([][]string{t.header}, t.rows...) {
		var b strings.Builder
		b.WriteString("  ")
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < t.left {
				b.WriteString(c)
				if i < len(r)-1 {
					b.WriteString(pad)
				}
			} else {
				b.WriteString(pad + c)
			}
		}
		tw.printf("%s\n", strings.TrimRight(b.String(), " "))
	}
}

// num formats a statistic with 4 significant digits; "-" when there is none.
func num(n Num) string {
	if !finite(float64(n)) {
		return "-"
	}
	return fnum(float64(n))
}

// fnum formats v with 4 significant digits, whole numbers below a million in full.
func fnum(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e6 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func ratioCell(a, b float64) string {
	if !finite(a) || !finite(b) || b == 0 {
		return "-"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64) + "×"
}

func itoa(n int) string { return strconv.Itoa(n) }

func intPtr(p *int) string {
	if p == nil {
		return "-"
	}
	return itoa(*p)
}

func intOrNaN(p *int) float64 {
	if p == nil {
		return math.NaN()
	}
	return float64(*p)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return itoa(n) + " " + what + "s"
}

// sigma prints the agents' σ_k diagnostics, when the run logs them.
func (tw *textWriter) sigma(agents []AgentSummary) {
	t := table{header: []string{"agent", "σ_k min", "σ_k median", "σ_k<0.01", "|A| max"}, left: 1}
	for _, a := range agents {
		if s := a.Sigma; s != nil {
			t.add(a.Name, num(s.Min), num(s.Median), num(s.FracLow), num(s.AbsAdMax))
		}
	}
	if len(t.rows) > 0 {
		tw.printf("  σ_k over the agents' (uid, agent) groups (adv_std/agent/<a>/*; median: mean of the iterations'):\n")
		tw.table(t)
	}
}
