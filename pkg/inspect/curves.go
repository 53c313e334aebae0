package inspect

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/drmas/drmas/pkg/jsonl"
	"github.com/drmas/drmas/pkg/metric"
)

// CurvesFile is the name of the curves drawn into a run folder (by training when it ends, and by
// `drmas plot RUN`).
const CurvesFile = "curves.svg"

// Curves is every key of a run's metrics.jsonl as a series over steps, deduplicated by step (the last
// row wins) and sorted.
type Curves struct {
	Label  string
	File   string
	Steps  []int
	Series map[string]Series // by metrics key (step aside)
}

// ReadCurves reads a run's metrics (path: a run directory or a metrics file), as ReadMetrics does but
// keeping every key. Malformed lines are skipped with a warning.
func ReadCurves(path string) (*Curves, []Warning, error) {
	file, _, err := metricsPath(path)
	if err != nil {
		return nil, nil, err
	}
	rr := &rowReader{file: file, keep: func(k string) bool { return k != metric.Step }}
	if _, err := jsonl.ReadFile(file, rr.line); err != nil {
		return nil, nil, fmt.Errorf("run %s: %w", path, err)
	}
	c := &Curves{Label: runLabel(file), File: file, Series: map[string]Series{}}
	for _, rw := range rr.sorted() {
		c.Steps = append(c.Steps, rw.step)
		for k, v := range rw.vals {
			s := c.Series[k]
			s.Steps = append(s.Steps, rw.step)
			s.Values = append(s.Values, v)
			c.Series[k] = s
		}
	}
	if len(c.Steps) == 0 {
		rr.warns = append(rr.warns, Warning{File: file, Message: "no metrics rows"})
	}
	return c, rr.warns, nil
}

// FirstLast returns a key's first and last finite values and their steps; ok is false when the key
// has no finite value.
func (c *Curves) FirstLast(key string) (first, last float64, firstStep, lastStep int, ok bool) {
	s := c.Series[key]
	for i, v := range s.Values {
		if !finite(v) {
			continue
		}
		if !ok {
			first, firstStep, ok = v, s.Steps[i], true
		}
		last, lastStep = v, s.Steps[i]
	}
	return first, last, firstStep, lastStep, ok
}

// withPrefix returns the keys starting with prefix, sorted.
func (c *Curves) withPrefix(prefix string) []string {
	var out []string
	for k := range c.Series {
		if strings.HasPrefix(k, prefix) && len(k) > len(prefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// curve is one line of a curves panel.
type curve struct {
	label  string
	key    string
	marked bool // points drawn too (a sparse series: validation)
	points bool // points only (a figure of a few iterations: the validation's time)
}

// curvePanel is one panel of PlotCurves.
type curvePanel struct {
	title, y string
	curves   []curve
}

// curvePanels returns the panels a run has data for: reward (the mean and per agent), validation
// (avg@k and pass@k over the datasets, and per dataset when there are several), per-agent gradient
// norms (per model when no agent series), the time split of an iteration, and tokens/s.
func curvePanels(c *Curves) []curvePanel {
	var out []curvePanel
	add := func(p curvePanel) {
		var kept []curve
		for _, cv := range p.curves {
			if _, ok := c.Series[cv.key]; ok {
				kept = append(kept, cv)
			}
		}
		if len(kept) > 0 {
			p.curves = kept
			out = append(out, p)
		}
	}
	reward := curvePanel{title: "reward", y: "mean reward", curves: []curve{{label: "all", key: metric.RewardMean}}}
	for _, k := range c.withPrefix(metric.RewardAgent("")) {
		reward.curves = append(reward.curves, curve{label: strings.TrimPrefix(k, metric.RewardAgent("")), key: k})
	}
	add(reward)

	val := curvePanel{title: "validation", y: "avg@k, pass@k"}
	var perDataset []curve
	datasets := map[string]bool{}
	for _, k := range c.withPrefix("val/") {
		rest := strings.TrimPrefix(k, "val/")
		i := strings.LastIndex(rest, "/")
		stat := rest[i+1:]
		if !strings.HasPrefix(stat, "avg@") && !strings.HasPrefix(stat, "pass@") || strings.Contains(rest, "/agent/") {
			continue
		}
		if i < 0 {
			val.curves = append(val.curves, curve{label: stat, key: k, marked: true})
		} else {
			datasets[rest[:i]] = true
			perDataset = append(perDataset, curve{label: rest, key: k, marked: true})
		}
	}
	if len(datasets) > 1 {
		val.curves = append(val.curves, perDataset...)
	}
	add(val)

	grads := curvePanel{title: "pre-clip gradient norm", y: "L2 norm"}
	for _, k := range c.withPrefix(metric.GradNormAgent("")) {
		grads.curves = append(grads.curves, curve{label: strings.TrimPrefix(k, metric.GradNormAgent("")), key: k})
	}
	if len(grads.curves) == 0 {
		for _, k := range c.withPrefix(metric.GradNormModel("")) {
			grads.curves = append(grads.curves, curve{label: "model " + strings.TrimPrefix(k, metric.GradNormModel("")), key: k})
		}
	}
	add(grads)

	times := curvePanel{title: "time per iteration", y: "seconds"}
	for _, k := range []string{metric.TimeIteration, metric.TimeRollout, metric.TimeUpdate, metric.TimeValidation, metric.TimeWeightSync, metric.TimeComm} {
		times.curves = append(times.curves, curve{label: strings.TrimPrefix(k, "time/"), key: k, marked: k == metric.TimeValidation, points: k == metric.TimeValidation})
	}
	add(times)

	add(curvePanel{title: "throughput", y: "tokens/s", curves: []curve{{label: "tokens/s", key: metric.PerfTokensPerS}}})
	return out
}

// PlotCurves draws what a person watches a run by, one panel each, stacked with a shared step axis:
// reward (mean and per agent), validation avg@k and pass@k, per-agent pre-clip gradient norms (log y
// when they span more than 2 decades, or with opt.LogY), the time split of an iteration, and tokens/s.
// Panels without data are left out. Non-finite values break a line. The image is opt.Width wide and
// opt.PanelHeight per panel (plus a title strip) high.
func PlotCurves(w io.Writer, c *Curves, opt PlotOptions) error {
	opt = opt.withDefaults(DefaultPanelHeight)
	panels := curvePanels(c)
	if len(panels) == 0 {
		return errors.New("plot: no reward, validation, gradient norm, time or throughput series in the run")
	}
	xmin, xmax := 0.0, 1.0
	if n := len(c.Steps); n > 0 {
		xmin, xmax = float64(c.Steps[0]), float64(c.Steps[n-1])
		if xmin == xmax {
			xmin, xmax = xmin-1, xmax+1
		}
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p, err := curvePlot(pn, c, opt.LogY && pn.title == "pre-clip gradient norm")
		if err != nil {
			return fmt.Errorf("plot %s: %w", pn.title, err)
		}
		p.X.Min, p.X.Max = xmin, xmax
		if i == len(panels)-1 {
			p.X.Label.Text = "step"
		}
		plots[i] = []*plot.Plot{p}
	}
	title := fmt.Sprintf("%s: steps %d–%d", c.Label, int(xmin), int(xmax))
	if len(c.Steps) == 0 {
		title = c.Label + ": no steps"
	}
	cv, body, err := canvas(opt, vg.Length(len(panels))*opt.PanelHeight, []legendEntry{{title, blank{}}})
	if err != nil {
		return err
	}
	return drawPanels(w, cv, body, plots)
}

// blank is a legend thumbnail that draws nothing (the title strip).
type blank struct{}

func (blank) Thumbnail(*draw.Canvas) {}

// curvePlot builds one panel: a line per curve in palette order, with a legend.
func curvePlot(pn curvePanel, c *Curves, forceLog bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.Y.Label.Text = pn.y
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.ThumbnailWidth = vg.Points(14)

	lo, hi := math.Inf(1), math.Inf(-1)   // positive finite values, for the log decision
	min, max := math.Inf(1), math.Inf(-1) // finite values, for the legend's headroom
	for _, cv := range pn.curves {
		for _, v := range c.Series[cv.key].Values {
			if finite(v) {
				min, max = math.Min(min, v), math.Max(max, v)
			}
			if finite(v) && v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	logY := pn.title == "pre-clip gradient norm" && lo <= hi && (forceLog || hi > lo*math.Pow(10, autoLogDecades))
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
	}
	drawn, rows := false, 0
	for i, cv := range pn.curves {
		col := palette[i%len(palette)]
		style := draw.LineStyle{Color: col, Width: vg.Points(1.2)}
		if cv.key == metric.RewardMean && len(pn.curves) > 1 {
			style.Width = vg.Points(2.2)
		}
		segs, _ := segmentsOf(c.Series[cv.key], logY)
		var thumb plot.Thumbnailer
		for _, seg := range segs {
			l, err := plotter.NewLine(seg)
			if err != nil {
				return nil, err
			}
			l.LineStyle = style
			if !cv.points {
				p.Add(l)
			}
			thumb = l
			if cv.marked {
				sc, err := plotter.NewScatter(seg)
				if err != nil {
					return nil, err
				}
				sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}
				p.Add(sc)
			}
			drawn = true
		}
		if thumb != nil {
			p.Legend.Add(cv.label, thumb)
			rows++
		}
	}
	if !drawn {
		p.Y.Min, p.Y.Max = 0, 1
		p.Title.Text += " (no finite values)"
		return p, nil
	}
	// Room above the data for the legend, top left: a row of it is about legendRow of the panel.
	frac := math.Min(0.6, legendRow*float64(rows))
	grow := frac / (1 - frac)
	switch {
	case logY:
		p.Y.Max = math.Max(p.Y.Max, hi*math.Pow(hi/lo, grow))
	case max > min:
		p.Y.Max = math.Max(p.Y.Max, max+(max-min)*grow)
	}
	return p, nil
}

// legendRow is the share of a panel's data area that one legend row takes (a 12-point row in about
// 2 inches), for the room left above the data.
const legendRow = 0.09
