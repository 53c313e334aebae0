package inspect

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// plotPNG plots runs with the default rule and decodes the PNG.
func plotPNG(t *testing.T, runs []*Run, opt PlotOptions) image.Image {
	t.Helper()
	rep, err := Summarize(runs, nil, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Plot(&buf, rep, runs, opt); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(buf.Bytes(), []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("not a PNG: % x", buf.Bytes()[:8])
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// hasColour reports whether some pixel of img is within 12 per channel of c.
func hasColour(img image.Image, c color.RGBA) bool {
	b := img.Bounds()
	near := func(a uint32, b uint8) bool { return math.Abs(float64(a>>8)-float64(b)) <= 12 }
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if near(r, c.R) && near(g, c.G) && near(bl, c.B) {
				return true
			}
		}
	}
	return false
}

func TestPlotPanelPerAgent(t *testing.T) {
	runs, _ := readFixtures(t)
	three := plotPNG(t, runs, PlotOptions{})
	// One agent only: one panel.
	one := &Run{Label: "one", Steps: []int{1, 2, 3}, GradAgent: map[string]Series{"solver": {Steps: []int{1, 2, 3}, Values: []float64{1, nan, 2}}}}
	single := plotPNG(t, []*Run{one}, PlotOptions{})

	const dpi = 96
	wantW := int(math.Round(float64(DefaultPlotWidth/vg.Inch) * dpi))
	panel := float64(DefaultPanelHeight/vg.Inch) * dpi
	for name, img := range map[string]image.Image{"three": three, "one": single} {
		if w := img.Bounds().Dx(); w != wantW {
			t.Errorf("%s: width %d px, want %d", name, w, wantW)
		}
	}
	if d := float64(three.Bounds().Dy() - single.Bounds().Dy()); math.Abs(d-2*panel) > 1 {
		t.Errorf("3 panels are %v px taller than 1, want %v (one panel per agent)", d, 2*panel)
	}
	if h := float64(single.Bounds().Dy()); math.Abs(h-(panel+float64(legendHeight/vg.Inch)*dpi)) > 1 {
		t.Errorf("one panel: height %v px", h)
	}
	// Both runs are drawn, each in its colour; the one-run plot has no second colour.
	for i, run := range runs {
		if !hasColour(three, palette[i]) {
			t.Errorf("no pixel in %s's colour %v", run.Label, palette[i])
		}
	}
	if hasColour(single, palette[1]) {
		t.Errorf("the one-run plot uses the second run's colour")
	}
}

func TestPlotPanels(t *testing.T) {
	runs, _ := readFixtures(t)
	if got := plotPanels(runs); len(got) != 3 || got[0].title() != "answerer" || got[2].title() != "verifier" {
		t.Errorf("panels %v", got)
	}
	// No agent series anywhere: one panel per model.
	models := &Run{Label: "m", Steps: []int{1}, GradModel: map[string]Series{"big": {Steps: []int{1}, Values: []float64{1}}, "small": {}}}
	if got := plotPanels([]*Run{models}); len(got) != 2 || got[0].title() != "model big" {
		t.Errorf("model panels %v", got)
	}
	if got := plotPanels([]*Run{{}}); len(got) != 0 {
		t.Errorf("empty run: panels %v", got)
	}
}

func TestPlotLogAndEdgeCases(t *testing.T) {
	// Zeros, a spread of 5 decades (auto log scale, so zeros must be left out), only-null series and
	// an agent absent from one run: all draw.
	a := &Run{Label: "a", Steps: []int{1, 2, 3, 4, 5}, GradAgent: map[string]Series{
		"wide":  {Steps: []int{1, 2, 3, 4, 5}, Values: []float64{0, 1e-3, 1, nan, 100}},
		"nulls": {Steps: []int{1, 2}, Values: []float64{nan, nan}},
	}}
	b := &Run{Label: "b", Steps: []int{1, 2}, GradAgent: map[string]Series{"wide": {Steps: []int{1, 2}, Values: []float64{1, 2}}}}
	plotPNG(t, []*Run{a, b}, PlotOptions{})
	plotPNG(t, []*Run{a, b}, PlotOptions{LogY: true})

	if got := (logTicks{}).Ticks(0.5, 60); !hasLabels(got, "0.5", "1", "2", "5", "10", "20", "50") {
		t.Errorf("log ticks 0.5–60: %v", got)
	}
	if got := (logTicks{}).Ticks(0.63, 0.9); len(got) == 0 || !allWithin(got, 0.63, 0.9) {
		t.Errorf("log ticks within a decade: %v", got)
	}

	rep, _ := Summarize([]*Run{a}, nil, DefaultOptions())
	var buf bytes.Buffer
	if err := Plot(&buf, rep, []*Run{a, b}, PlotOptions{}); err == nil {
		t.Error("a report on another number of runs was accepted")
	}
	if err := Plot(&buf, rep, []*Run{a}, PlotOptions{Format: "bmp"}); err == nil || !strings.Contains(err.Error(), "png") {
		t.Errorf("format bmp: %v", err)
	}
	empty, _ := Summarize([]*Run{{Label: "e"}}, nil, DefaultOptions())
	if err := Plot(&buf, empty, []*Run{{Label: "e"}}, PlotOptions{}); err == nil {
		t.Error("a run without norms plotted")
	}
	buf.Reset()
	if err := Plot(&buf, rep, []*Run{a}, PlotOptions{Format: "svg"}); err != nil || !strings.Contains(buf.String(), "<svg") {
		t.Errorf("svg: %v", err)
	}
}

// hasLabels reports whether the labelled ticks are exactly labels, in order.
func hasLabels(ticks []plot.Tick, labels ...string) bool {
	var got []string
	for _, t := range ticks {
		if t.Label != "" {
			got = append(got, t.Label)
		}
	}
	return slices.Equal(got, labels)
}

func allWithin(ticks []plot.Tick, lo, hi float64) bool {
	for _, t := range ticks {
		if t.Value < lo || t.Value > hi {
			return false
		}
	}
	return true
}
