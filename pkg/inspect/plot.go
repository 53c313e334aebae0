package inspect

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // png, jpg, tiff
	_ "gonum.org/v1/plot/vg/vgpdf" // pdf
	_ "gonum.org/v1/plot/vg/vgsvg" // svg
)

// Plot sizes, used when PlotOptions leaves them zero.
const (
	DefaultPlotWidth   = 9 * vg.Inch
	DefaultPanelHeight = 2.6 * vg.Inch
	legendHeight       = 0.35 * vg.Inch // the strip above the panels naming the runs
	autoLogDecades     = 2              // log y when a panel's positive values span more than this many decades
)

// PlotOptions sets how Plot draws.
type PlotOptions struct {
	Format      string    // png (the default), jpg, tiff, svg or pdf
	LogY        bool      // log y on every panel; otherwise only on panels whose values span > 2 decades
	Width       vg.Length // of the image
	PanelHeight vg.Length // of one panel; the image is one panel high per agent
}

// withDefaults fills the options left unset: png, DefaultPlotWidth wide, panelHeight a panel.
func (o PlotOptions) withDefaults(panelHeight vg.Length) PlotOptions {
	if o.Format == "" {
		o.Format = "png"
	}
	if o.Width <= 0 {
		o.Width = DefaultPlotWidth
	}
	if o.PanelHeight <= 0 {
		o.PanelHeight = panelHeight
	}
	return o
}

// palette holds the runs' colours, in order (matplotlib's tab10, so that GRPO vs Dr. MAS is blue vs orange).
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xd6, 0x27, 0x28, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff},
	{0xbc, 0xbd, 0x22, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

// Plot draws each agent's pre-clip gradient norm over steps, one panel per agent stacked vertically with
// a shared step axis, one line per run in its own colour, the report's spikes ringed and non-finite norms
// crossed along the top edge, under one legend strip naming the runs. When no run has agent series, the
// panels are per model instead. rep must be Summarize's report on runs (its labels and spike steps are
// drawn). The image is opt.Width wide and opt.PanelHeight per panel (plus the legend strip) high.
func Plot(w io.Writer, rep *Report, runs []*Run, opt PlotOptions) error {
	if len(rep.Runs) != len(runs) {
		return fmt.Errorf("plot: the report covers %d runs, not %d", len(rep.Runs), len(runs))
	}
	opt = opt.withDefaults(DefaultPanelHeight)
	panels := plotPanels(runs)
	if len(panels) == 0 {
		return errors.New("plot: no grad_norm/agent/* or grad_norm/model/* series in any run")
	}
	xmin, xmax := stepRange(runs)
	plots := make([][]*plot.Plot, len(panels))
	var spiked, crossed bool
	for i, pn := range panels {
		p, sp, cr, err := panelPlot(pn, rep, runs, opt.LogY)
		if err != nil {
			return fmt.Errorf("plot %s: %w", pn.title(), err)
		}
		spiked, crossed = spiked || sp, crossed || cr
		p.X.Min, p.X.Max = xmin, xmax
		if i == len(panels)-1 {
			p.X.Label.Text = "step"
		}
		plots[i] = []*plot.Plot{p}
	}

	var entries []legendEntry
	for i := range runs {
		entries = append(entries, legendEntry{rep.Runs[i].Label, &plotter.Line{LineStyle: draw.LineStyle{Color: palette[i%len(palette)], Width: vg.Points(2)}}})
	}
	if spiked {
		entries = append(entries, legendEntry{"spike", glyphThumb(draw.RingGlyph{})})
	}
	if crossed {
		entries = append(entries, legendEntry{"non-finite", glyphThumb(draw.CrossGlyph{})})
	}
	c, body, err := canvas(opt, vg.Length(len(panels))*opt.PanelHeight, entries)
	if err != nil {
		return err
	}

	return drawPanels(w, c, body, plots)
}

// drawPanels draws plots, one a row, into body, aligned, and writes the image cv holds to w.
func drawPanels(w io.Writer, cv vg.CanvasWriterTo, body draw.Canvas, plots [][]*plot.Plot) error {
	pad := vg.Points(6)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadBottom: pad, PadLeft: pad, PadRight: 2 * pad, PadY: 2 * pad}
	canvases := plot.Align(plots, tiles, body)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if _, err := cv.WriteTo(w); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// canvas makes an image of opt's format and width, a legend strip over a body `height` high: it draws
// the legend and returns the canvas (to write out) and the body (to draw the panels in).
func canvas(opt PlotOptions, height vg.Length, entries []legendEntry) (vg.CanvasWriterTo, draw.Canvas, error) {
	strip := legendHeight * vg.Length(max(1, len(legendRows(entries, opt.Width))))
	c, err := draw.NewFormattedCanvas(opt.Width, strip+height, strings.ToLower(opt.Format))
	if err != nil {
		return nil, draw.Canvas{}, fmt.Errorf("plot: %w (want png, jpg, tiff, svg or pdf)", err)
	}
	dc := draw.New(c)
	legend, body := dc, dc
	legend.Min.Y = dc.Max.Y - strip
	body.Max.Y = legend.Min.Y
	drawLegend(legend, entries)
	return c, body, nil
}

// legendEntry is one item of the legend strip.
type legendEntry struct {
	label string
	thumb plot.Thumbnailer
}

// drawLegend draws the entries side by side, centred in c: thumbnail, then label.
func drawLegend(c draw.Canvas, entries []legendEntry) {
	sty := legendStyle()
	rows := legendRows(entries, c.Max.X-c.Min.X)
	h := sty.Height("M")
	for i, row := range rows {
		total := vg.Length(0)
		for _, e := range row {
			total += entryWidth(sty, e)
		}
		x := c.Min.X + max(0, (c.Max.X-c.Min.X-total)/2)
		y := c.Max.Y - (vg.Length(i)+0.5)*legendHeight
		for _, e := range row {
			tc := c
			tc.Rectangle = vg.Rectangle{Min: vg.Point{X: x, Y: y - h/2}, Max: vg.Point{X: x + legendThumb, Y: y + h/2}}
			e.thumb.Thumbnail(&tc)
			x += legendThumb + legendGap
			c.FillText(sty, vg.Point{X: x, Y: y}, e.label)
			x += sty.Width(e.label) + 3*legendGap
		}
	}
}

// The legend's thumbnail width and gap.
const (
	legendThumb = vg.Length(22)
	legendGap   = vg.Length(5)
)

func legendStyle() text.Style {
	sty := plot.NewLegend().TextStyle
	sty.YAlign = draw.YCenter
	return sty
}

func entryWidth(sty text.Style, e legendEntry) vg.Length {
	return legendThumb + legendGap + sty.Width(e.label) + 3*legendGap
}

// legendRows splits the entries into rows no wider than width (at least one entry a row).
func legendRows(entries []legendEntry, width vg.Length) [][]legendEntry {
	sty := legendStyle()
	var rows [][]legendEntry
	var used vg.Length
	for _, e := range entries {
		w := entryWidth(sty, e)
		if len(rows) == 0 || used+w > width && len(rows[len(rows)-1]) > 0 {
			rows, used = append(rows, nil), 0
		}
		rows[len(rows)-1] = append(rows[len(rows)-1], e)
		used += w
	}
	return rows
}

// panel is one plot panel: an agent's series, or a model's.
type panel struct {
	name  string
	model bool
}

func (p panel) title() string {
	if p.model {
		return "model " + p.name
	}
	return p.name
}

// norms returns run's gradient norms for the panel.
func (p panel) norms(run *Run) (Series, bool) {
	m := run.GradAgent
	if p.model {
		m = run.GradModel
	}
	s, ok := m[p.name]
	return s, ok
}

// spikeSteps returns the report's spike steps for the panel in one run.
func (p panel) spikeSteps(s RunSummary) []int {
	if p.model {
		for _, m := range s.Models {
			if m.Name == p.name {
				return m.SpikeSteps
			}
		}
		return nil
	}
	for _, a := range s.Agents {
		if a.Name == p.name {
			return a.SpikeSteps
		}
	}
	return nil
}

// plotPanels returns one panel per agent found in any run, sorted; one per model if no run has agents.
func plotPanels(runs []*Run) []panel {
	var agents, models []map[string]Series
	for _, r := range runs {
		agents = append(agents, r.GradAgent)
		models = append(models, r.GradModel)
	}
	var panels []panel
	for _, a := range sortedKeys(agents...) {
		panels = append(panels, panel{name: a})
	}
	if len(panels) > 0 {
		return panels
	}
	for _, m := range sortedKeys(models...) {
		panels = append(panels, panel{name: m, model: true})
	}
	return panels
}

func stepRange(runs []*Run) (float64, float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		if n := len(r.Steps); n > 0 {
			lo, hi = math.Min(lo, float64(r.Steps[0])), math.Max(hi, float64(r.Steps[n-1]))
		}
	}
	if lo > hi {
		return 0, 1
	}
	if lo == hi {
		return lo - 1, hi + 1
	}
	return lo, hi
}

// panelPlot builds one panel.
// It reports whether it ringed any spike and crossed any non-finite norm.
func panelPlot(pn panel, rep *Report, runs []*Run, forceLog bool) (p *plot.Plot, spiked, crossed bool, err error) {
	p = plot.New()
	p.Title.Text = pn.title()
	p.Y.Label.Text = "pre-clip grad norm"
	p.Add(plotter.NewGrid())

	lo, hi := math.Inf(1), math.Inf(-1) // positive finite values, for the log decision
	for _, run := range runs {
		ser, _ := pn.norms(run)
		for _, v := range ser.Values {
			if finite(v) && v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	logY := lo <= hi && (forceLog || hi > lo*math.Pow(10, autoLogDecades))
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
	}

	var nonfinite []plotter.XYs // per run: steps whose norm was not finite
	for i, run := range runs {
		col := palette[i%len(palette)]
		ser, ok := pn.norms(run)
		if !ok {
			nonfinite = append(nonfinite, nil)
			continue
		}
		segments, bad := segmentsOf(ser, logY)
		for _, seg := range segments {
			l, err := plotter.NewLine(seg)
			if err != nil {
				return nil, false, false, err
			}
			l.Color, l.Width = col, vg.Points(1.2)
			p.Add(l)
		}
		nonfinite = append(nonfinite, bad)
		if pts := spikePoints(ser, pn.spikeSteps(rep.Runs[i]), logY); len(pts) > 0 {
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, false, false, err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(4), Shape: draw.RingGlyph{}}
			p.Add(sc)
			spiked = true
		}
	}
	if lo > hi { // nothing finite to draw: give the axes a range
		p.Y.Min, p.Y.Max = 0, 1
		if logY {
			p.Y.Min = 0.1
		}
		p.Title.Text += " (no finite norms)"
	}
	// Non-finite norms: crosses along the top edge, in the run's colour.
	for i, xs := range nonfinite {
		if len(xs) == 0 {
			continue
		}
		for k := range xs {
			xs[k].Y = p.Y.Max
		}
		sc, err := plotter.NewScatter(xs)
		if err != nil {
			return nil, false, false, err
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: palette[i%len(palette)], Radius: vg.Points(4), Shape: draw.CrossGlyph{}}
		p.Add(sc)
		crossed = true
	}
	return p, spiked, crossed, nil
}

// segmentsOf splits a series into drawable runs of points, breaking at non-finite values (returned as
// x positions, y 0) and, on a log axis, at values ≤ 0.
func segmentsOf(s Series, logY bool) (segs []plotter.XYs, nonfinite plotter.XYs) {
	var cur plotter.XYs
	flush := func() {
		if len(cur) > 0 {
			segs = append(segs, cur)
			cur = nil
		}
	}
	for i, v := range s.Values {
		x := float64(s.Steps[i])
		switch {
		case !finite(v):
			nonfinite = append(nonfinite, plotter.XY{X: x})
			flush()
		case logY && v <= 0:
			flush()
		default:
			cur = append(cur, plotter.XY{X: x, Y: v})
		}
	}
	flush()
	return segs, nonfinite
}

// spikePoints returns the points of s at the given steps.
func spikePoints(s Series, steps []int, logY bool) plotter.XYs {
	want := map[int]bool{}
	for _, st := range steps {
		want[st] = true
	}
	var pts plotter.XYs
	for i, st := range s.Steps {
		if want[st] && finite(s.Values[i]) && (!logY || s.Values[i] > 0) {
			pts = append(pts, plotter.XY{X: float64(st), Y: s.Values[i]})
		}
	}
	return pts
}

// glyphThumb is a legend entry showing a black glyph.
func glyphThumb(shape draw.GlyphDrawer) plot.Thumbnailer {
	return &plotter.Scatter{GlyphStyle: draw.GlyphStyle{Color: color.Black, Radius: vg.Points(4), Shape: shape}}
}

// logTicks marks a log axis: labels at 1, 2 and 5 × 10^k (at 10^k only over more than 4 decades), minor
// ticks at the other digits. A range too narrow for two labels gets the linear ticks instead. Only ticks
// within the range are returned: the axis normalizes every tick, and a log scale panics on values ≤ 0.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi >= lo) {
		return nil
	}
	many := math.Log10(hi/lo) > 4
	var ticks []plot.Tick
	labels := 0
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for d := 1; d <= 9; d++ {
			v := float64(d) * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if d == 1 || !many && (d == 2 || d == 5) {
				t.Label = strconv.FormatFloat(v, 'g', 3, 64)
				labels++
			}
			ticks = append(ticks, t)
		}
	}
	if labels >= 2 {
		return ticks
	}
	ticks = ticks[:0]
	for _, t := range (plot.DefaultTicks{}).Ticks(lo, hi) {
		if t.Value >= lo && t.Value <= hi {
			ticks = append(ticks, t)
		}
	}
	return ticks
}
