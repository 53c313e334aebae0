package inspect

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/grpo and testdata/drmas from the generator")

// The synthetic runs in testdata/: a search system of three non-shared agents over 120 iterations, with
// smooth base norms and spikes planted at known steps. The GRPO run mirrors the paper's picture (the
// rarely called searcher spikes, reaches 82, then goes non-finite); the Dr. MAS run has one spike.
type fixture struct {
	name, normalization string
	scale               float64                    // of the base norms (0 = 1)
	spikes              map[string]map[int]float64 // agent → step → norm planted there
	nulls               map[string][]int           // agent → steps whose norm is non-finite (null)
	inflation           map[string]float64         // agent → level of inflation/agent/<a>
	wantSpikes          map[string][]int           // agent → the steps Spikes must flag, default rule
}

var fixtureAgents = []string{"verifier", "searcher", "answerer"}

var fixtures = []fixture{
	{
		name: "grpo", normalization: "grpo",
		spikes: map[string]map[int]float64{
			// step 6 comes before window/2 = 10 earlier values: not flagged; step 11 has exactly 10;
			// 40 and 41 are back to back; 60 is 4× the median, under the factor 5.
			"searcher": {6: 40, 11: 30, 40: 30, 41: 25, 60: 8, 85: 82.4},
			"answerer": {70: 9.5},
		},
		nulls:      map[string][]int{"searcher": {86, 87}},
		inflation:  map[string]float64{"verifier": 0.9, "searcher": 4.1, "answerer": 0.92},
		wantSpikes: map[string][]int{"verifier": {}, "searcher": {11, 40, 41, 85}, "answerer": {70}},
	},
	{
		name: "drmas", normalization: "drmas", scale: 0.9,
		spikes:     map[string]map[int]float64{"searcher": {50: 12}},
		inflation:  map[string]float64{"verifier": 1, "searcher": 1, "answerer": 1},
		wantSpikes: map[string][]int{"verifier": {}, "searcher": {50}, "answerer": {}},
	},
}

const fixtureSteps = 120

// baseNorm is an agent's smooth, spike-free norm at a step.
func baseNorm(agent string, step int) float64 {
	s := float64(step)
	switch agent {
	case "verifier":
		return 0.8 + 0.1*math.Sin(0.7*s)
	case "searcher":
		return 2.0 + 0.3*math.Sin(0.9*s+1)
	default:
		return 0.6 + 0.08*math.Sin(1.1*s+2)
	}
}

func round4(v float64) string { return strconv.FormatFloat(math.Round(v*1e4)/1e4, 'f', -1, 64) }

// metricsText renders the fixture's metrics.jsonl, keys in a fixed order.
func (f fixture) metricsText() string {
	var b strings.Builder
	for step := 1; step <= fixtureSteps; step++ {
		fields := []string{`"step":` + strconv.Itoa(step), `"epoch":0`,
			`"reward/mean":` + round4(0.2+0.3*float64(step)/fixtureSteps)}
		for _, a := range fixtureAgents {
			v, null := baseNorm(a, step), false
			if f.scale != 0 {
				v *= f.scale
			}
			if s, ok := f.spikes[a][step]; ok {
				v = s
			}
			for _, n := range f.nulls[a] {
				null = null || n == step
			}
			norm, skipped := round4(v), "0"
			if null {
				norm, skipped = "null", strconv.Itoa(1+step%2)
			}
			infl := round4(f.inflation[a] * (1 + 0.1*math.Sin(float64(step))))
			if f.inflation[a] == 1 {
				infl = "1"
			}
			fields = append(fields,
				`"grad_norm/agent/`+a+`":`+norm,
				`"grad_norm_mean/agent/`+a+`":`+map[bool]string{true: "null", false: round4(v * 0.7)}[null],
				`"grad_norm/model/`+a+`-7b":`+norm,
				`"nonfinite/model/`+a+`-7b":`+skipped,
				`"inflation/agent/`+a+`":`+infl)
		}
		fields = append(fields, `"time/step":`+round4(3.5+0.01*float64(step%7)))
		b.WriteString("{" + strings.Join(fields, ",") + "}\n")
	}
	return b.String()
}

func (f fixture) configText() string {
	var b strings.Builder
	b.WriteString("# Resolved config (the parts inspect-grads reads, and a few more).\n")
	b.WriteString("run: {dir: runs/" + f.name + ", seed: 1, steps: 120}\nmodels:\n")
	for _, a := range fixtureAgents {
		b.WriteString("  - {id: " + a + "-7b, path: \"\"}\n")
	}
	b.WriteString("agents:\n")
	for _, a := range fixtureAgents {
		b.WriteString("  - {name: " + a + ", model: " + a + "-7b}\n")
	}
	b.WriteString("algorithm:\n  normalization: " + f.normalization + "\n  group_size: 8\n")
	return b.String()
}

// TestFixturesUpToDate checks testdata/grpo and testdata/drmas against the generator (-update rewrites them).
func TestFixturesUpToDate(t *testing.T) {
	for _, f := range fixtures {
		for file, want := range map[string]string{MetricsFile: f.metricsText(), ConfigFile: f.configText()} {
			path := filepath.Join("testdata", f.name, file)
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, []byte(want)) {
				t.Errorf("%s differs from its generator; run go test ./pkg/inspect -run TestFixturesUpToDate -update", path)
			}
		}
	}
}

// writeMetrics writes lines as a metrics.jsonl in a new run directory and returns the directory.
func writeMetrics(t *testing.T, name, text string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, MetricsFile), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
