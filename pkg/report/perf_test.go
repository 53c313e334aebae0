package report

import (
	"errors"
	"math"
	"testing"

	"github.com/drmas/drmas/pkg/metric"
)

// The peak: run.peak_tflops wins; a CPU has none; a GPU the table names has its dtype's figure, asked
// once; an unknown GPU or a failing nvidia-smi none.
func TestDevicePeak(t *testing.T) {
	defer func(f func(string) (string, error)) { gpuName = f }(gpuName)
	asked := 0
	gpuName = func(dev string) (string, error) {
		asked++
		switch dev {
		case "cuda:0":
			return "NVIDIA H200", nil
		case "cuda:1":
			return "NVIDIA GeForce GTX 1080", nil
		}
		return "", errors.New("no nvidia-smi")
	}
	peaks.Clear()
	for _, tc := range []struct {
		dev, dtype string
		override   float64
		want       float64
	}{
		{"cpu", "bfloat16", 0, 0},
		{"cpu", "float32", 1.5, 1.5},
		{"cuda:0", "bfloat16", 0, 989},
		{"cuda:0", "bfloat16", 0, 989},
		{"cuda:0", "bfloat16", 500, 500},
		{"cuda:0", "float32", 0, 67},
		{"cuda:1", "bfloat16", 0, 0},
		{"cuda:2", "bfloat16", 0, 0},
	} {
		if got := devicePeak(tc.dev, tc.dtype, tc.override); got != tc.want {
			t.Errorf("devicePeak(%s, %s, %g) = %g, want %g", tc.dev, tc.dtype, tc.override, got, tc.want)
		}
	}
	if asked != 4 {
		t.Errorf("nvidia-smi asked %d times, want 4 (once per device and dtype)", asked)
	}
}

// addPerf writes tokens/s over the model's own update time and, with a peak, MFU.
func TestAddPerf(t *testing.T) {
	work := []Work{{Model: "m", Tokens: 5, FLOPs: 3 * 13440, Seconds: 2, Device: "cpu", DType: "float32"}}
	m := metric.Row{}
	addPerf(m, work, 0)
	if got := m[metric.PerfTokensPerSModel("m")]; got != 2.5 {
		t.Errorf("tokens/s = %g, want 5 tokens / 2 s", got)
	}
	if _, ok := m[metric.PerfMFUModel("m")]; ok {
		t.Error("MFU on a CPU without run.peak_tflops")
	}
	addPerf(m, work, 1e-9) // 1,000 FLOP/s
	if got, want := m[metric.PerfMFUModel("m")], 3*13440/2.0/1000; math.Abs(got-want) > 1e-9 {
		t.Errorf("MFU = %g, want %g", got, want)
	}
}
