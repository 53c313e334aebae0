package inspect

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// PlotPooled draws the measured ratio |g_grpo|²/|g_drmas|² against each predictor, one panel per
// predictor, two panels a row, log-log, one colour per label (e.g. a dial setting), each panel titled with
// its Spearman correlation and interval. An infinite ratio (Dr. MAS gave no gradient) is drawn as a
// cross on the panel's top (measured) or right (predictor) edge. opt.Width is the whole image's width
// and opt.PanelHeight a row's height.
func PlotPooled(w io.Writer, p *Pooled, opt PlotOptions) error {
	opt = opt.withDefaults(4 * vg.Inch)
	const cols = 2
	var plots [][]*plot.Plot
	for i, pr := range predictors {
		pl, err := pooledPanel(p, pr.of, pr.title, p.Correlations[i])
		if err != nil {
			return fmt.Errorf("plot %s: %w", pr.name, err)
		}
		if i%cols == 0 {
			plots = append(plots, nil)
		}
		plots[len(plots)-1] = append(plots[len(plots)-1], pl)
	}
	rows := len(plots)
	for len(plots[rows-1]) < cols { // an empty tile
		plots[rows-1] = append(plots[rows-1], nil)
	}

	var entries []legendEntry
	for _, l := range distinct(p.Labels) {
		entries = append(entries, legendEntry{l, &plotter.Scatter{GlyphStyle: draw.GlyphStyle{Color: labelColour(p, l), Radius: vg.Points(3), Shape: draw.CircleGlyph{}}}})
	}
	entries = append(entries, legendEntry{"∞ (Dr. MAS: no gradient)", glyphThumb(draw.CrossGlyph{})})
	c, body, err := canvas(opt, vg.Length(rows)*opt.PanelHeight, entries)
	if err != nil {
		return err
	}
	pad := vg.Points(6)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadBottom: pad, PadLeft: pad, PadRight: 2 * pad, PadX: 3 * pad, PadY: 3 * pad}
	for i := range plots {
		for j, pl := range plots[i] {
			if pl != nil {
				pl.Draw(tiles.At(body, j, i))
			}
		}
	}
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// labelColour is the palette colour of a label, by its position among the distinct labels.
func labelColour(p *Pooled, label string) color.Color {
	return palette[max(0, slices.Index(distinct(p.Labels), label))%len(palette)]
}

func pooledPanel(p *Pooled, pred func(CounterfactualRow) float64, title string, corr Correlation) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = fmt.Sprintf("%s\nSpearman %.2f [%.2f, %.2f], %d rows", title, corr.Spearman, corr.Lo, corr.Hi, corr.Pairs)
	pl.X.Label.Text = "predicted (" + title + ")"
	pl.Y.Label.Text = "measured |g_grpo|²/|g_drmas|²"
	pl.Add(plotter.NewGrid())
	// Axis ranges over the positive finite values; infinities sit on the edges.
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, r := range p.Rows {
		x, y := pred(r.CounterfactualRow), r.Measured
		if x > 0 && !math.IsInf(x, 0) {
			xlo, xhi = math.Min(xlo, x), math.Max(xhi, x)
		}
		if y > 0 && !math.IsInf(y, 0) {
			ylo, yhi = math.Min(ylo, y), math.Max(yhi, y)
		}
	}
	if xlo > xhi || ylo > yhi { // nothing finite to draw: give the axes a range
		xlo, xhi, ylo, yhi = 1, 1, 1, 1
		pl.Title.Text += " (no finite pairs)"
	}
	xlo, xhi, ylo, yhi = xlo/1.5, xhi*1.5, ylo/1.5, yhi*1.5
	pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = xlo, xhi, ylo, yhi
	pl.X.Scale, pl.Y.Scale = plot.LogScale{}, plot.LogScale{}
	pl.X.Tick.Marker, pl.Y.Tick.Marker = logTicks{}, logTicks{}

	for _, label := range distinct(p.Labels) {
		var pts, edge plotter.XYs
		for _, r := range p.Rows {
			if r.Label != label {
				continue
			}
			x, y := pred(r.CounterfactualRow), r.Measured
			if math.IsNaN(x) || math.IsNaN(y) || x <= 0 || y <= 0 {
				continue
			}
			inf := false
			if math.IsInf(x, 1) {
				x, inf = xhi, true
			}
			if math.IsInf(y, 1) {
				y, inf = yhi, true
			}
			if inf {
				edge = append(edge, plotter.XY{X: x, Y: y})
			} else {
				pts = append(pts, plotter.XY{X: x, Y: y})
			}
		}
		col := labelColour(p, label)
		for _, set := range []struct {
			xy    plotter.XYs
			shape draw.GlyphDrawer
		}{{pts, draw.CircleGlyph{}}, {edge, draw.CrossGlyph{}}} {
			if len(set.xy) == 0 {
				continue
			}
			sc, err := plotter.NewScatter(set.xy)
			if err != nil {
				return nil, err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(2.5), Shape: set.shape}
			pl.Add(sc)
		}
	}
	return pl, nil
}

// distinct lists the labels in order of first appearance.
func distinct(labels []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range labels {
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return out
}
