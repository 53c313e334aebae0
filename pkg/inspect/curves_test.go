package inspect

import (
	"bytes"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"
)

// curvesRun writes a metrics.jsonl of steps rows: reward per agent, grad norms, time split and
// tokens/s every step, validation every 5th step when val, and returns its folder.
func curvesRun(t *testing.T, steps int, val bool, extra string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "toy-run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for s := 1; s <= steps; s++ {
		x := float64(s)
		fmt.Fprintf(&b, `{"step":%d,"epoch":0,"reward/mean":%g,"reward/agent/solver":%g,"reward/agent/verifier":%g,`+
			`"grad_norm/agent/solver":%g,"grad_norm/agent/verifier":null,"time/iteration":%g,"time/rollout":%g,`+
			`"time/update":%g,"perf/tokens_per_s":%g`, s, x/100, x/90, x/110, 1+0.1*x, 2.0, 1.2, 0.8, 1000+x)
		if val && s%5 == 0 {
			fmt.Fprintf(&b, `,"val/avg@4":%g,"val/pass@4":%g,"time/validation":0.5`, x/200, x/100)
		}
		b.WriteString("}\n")
	}
	b.WriteString(extra)
	if err := os.WriteFile(filepath.Join(dir, MetricsFile), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestReadCurves(t *testing.T) {
	dir := curvesRun(t, 10, true, "not json\n"+`{"step":3,"reward/mean":0.5}`+"\n")
	c, warns, err := ReadCurves(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Label != "toy-run" || len(c.Steps) != 10 || len(warns) != 1 || warns[0].Line != 11 {
		t.Fatalf("label %q, steps %v, warnings %v", c.Label, c.Steps, warns)
	}
	// Step 3's later row wins: its only key is the reward.
	if _, ok := c.Series["reward/agent/solver"]; !ok {
		t.Fatal("no reward/agent/solver series")
	}
	if s := c.Series["reward/agent/solver"]; len(s.Steps) != 9 {
		t.Fatalf("reward/agent/solver at %v: step 3's replaced row has none", s.Steps)
	}
	first, last, s0, s1, ok := c.FirstLast("reward/mean")
	if !ok || first != 0.01 || last != 0.1 || s0 != 1 || s1 != 10 {
		t.Fatalf("reward first→last %v %v %d %d %v", first, last, s0, s1, ok)
	}
	if s := c.Series["reward/mean"]; s.Values[2] != 0.5 {
		t.Fatalf("step 3's reward %v, want the later row's 0.5", s.Values[2])
	}
	if _, _, _, _, ok := c.FirstLast("grad_norm/agent/verifier"); ok {
		t.Fatal("all-null series has a finite value")
	}
	if s := c.Series["grad_norm/agent/verifier"]; len(s.Values) != 9 || !math.IsNaN(s.Values[0]) {
		t.Fatalf("null values: %v", s.Values)
	}
}

// PlotCurves draws one panel per kind of data: reward, validation, gradient norms, time, throughput;
// a run without validation has one panel fewer. Each agent's reward is drawn in its colour.
func TestPlotCurvesPanels(t *testing.T) {
	height := func(dir string) (int, bool) {
		c, _, err := ReadCurves(dir)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := PlotCurves(&buf, c, PlotOptions{}); err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(&buf)
		if err != nil {
			t.Fatal(err)
		}
		return img.Bounds().Dy(), hasColour(img, palette[2])
	}
	withVal, third := height(curvesRun(t, 30, true, ""))
	without, _ := height(curvesRun(t, 30, false, ""))
	panel := float64(DefaultPanelHeight/vg.Inch) * 96
	strip := float64(legendHeight/vg.Inch) * 96
	if math.Abs(float64(withVal)-(5*panel+strip)) > 1 || math.Abs(float64(withVal-without)-panel) > 1 {
		t.Fatalf("heights %d (with validation) and %d (without), panel %v: want 5 and 4 panels", withVal, without, panel)
	}
	if !third {
		t.Fatal("no line in the third colour (the verifier's reward)")
	}
	panels := curvePanels(mustCurves(t, curvesRun(t, 10, true, "")))
	var titles []string
	for _, p := range panels {
		titles = append(titles, fmt.Sprintf("%s:%d", p.title, len(p.curves)))
	}
	want := "reward:3 validation:2 pre-clip gradient norm:2 time per iteration:4 throughput:1"
	if got := strings.Join(titles, " "); got != want {
		t.Fatalf("panels %q, want %q", got, want)
	}
	if err := PlotCurves(&bytes.Buffer{}, &Curves{Label: "empty"}, PlotOptions{}); err == nil {
		t.Fatal("no series, yet a plot")
	}
}

func mustCurves(t *testing.T, dir string) *Curves {
	t.Helper()
	c, _, err := ReadCurves(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
