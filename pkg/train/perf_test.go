package train

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/flops"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/sugarme/gotch"
)

// The FLOPs of an update by hand (pkg/flops' small config: a 5-token call with 2 response tokens is
// 13,440 FLOPs forward): a trained call takes a training pass (3 forwards) per epoch and the log-prob
// passes (1 each); a call left out of the backward only the log-prob passes.
func TestUpdateFLOPsByHand(t *testing.T) {
	c := arch.Config{HiddenSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 4, IntermediateSize: 16, VocabSize: 10}
	items := []*item{
		{agent: "a", prompt: []int{1, 2, 3}, response: []int{4, 5}, adv: 1},
		{agent: "a", prompt: []int{1, 2, 3}, response: []int{4, 5}, adv: 0},
	}
	ms := &modelState{upd: updates{epochs: 2, miniBatches: 1}, loss: objective{agents: map[string]agentCoefs{"a": {}}}}
	w := ms.work()
	if w.train != flops.TrainPass || w.epochs != 2 || w.logProb != 1 {
		t.Fatalf("work = %+v, want a training pass, 2 epochs, the old log-probs recomputed", w)
	}
	tokens, fl := w.count(c, items)
	// trained: (2 epochs × 3 + 1) × 13,440 = 94,080; idle: 1 × 13,440
	if tokens != 10 || fl != 94080+13440 {
		t.Errorf("count = %g tokens, %g FLOPs; want 10, 107,520", tokens, fl)
	}
	// One update per iteration: no old log-prob pass. With an entropy term the zero-advantage call
	// trains too. A LoRA adapter's pass is two forwards.
	ms = &modelState{upd: updates{epochs: 1, miniBatches: 1}, cfg: config.ModelConfig{Base: "base"},
		loss: objective{agents: map[string]agentCoefs{"a": {entropy: 0.01}}}}
	w = ms.work()
	if _, fl := w.count(c, items); w.logProb != 0 || fl != 2*flops.AdapterPass*13440 {
		t.Errorf("adapter, on-policy, entropy: %g FLOPs (work %+v), want %d", fl, w, 2*2*13440)
	}
}

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

// addPerf writes tokens/s over the model's own update time and, with a peak, MFU; this rank's calls
// only (another rank's are remote).
func TestAddPerf(t *testing.T) {
	c := arch.Config{HiddenSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 4, IntermediateSize: 16, VocabSize: 10}
	ms := &modelState{id: "m", pol: &policy.Policy{Device: gotch.CPU, Model: &policy.Model{Config: c}},
		upd: updates{epochs: 1, miniBatches: 1}, loss: objective{agents: map[string]agentCoefs{"a": {}}}}
	items := map[string][]*item{"m": {
		{agent: "a", prompt: []int{1, 2, 3}, response: []int{4, 5}, adv: 1},
		{agent: "a", prompt: []int{1, 2, 3}, response: []int{4, 5}, adv: 1, remote: true},
	}}
	st := modelStats{times: updateTimes{fwdBwd: 1500 * time.Millisecond, optimizer: 500 * time.Millisecond}}
	m := Metrics{}
	m.addPerf([]*modelState{ms}, []modelStats{st}, items, 0)
	if got := m[metric.PerfTokensPerSModel("m")]; got != 2.5 {
		t.Errorf("tokens/s = %g, want 5 tokens / 2 s", got)
	}
	if _, ok := m[metric.PerfMFUModel("m")]; ok {
		t.Error("MFU on a CPU without run.peak_tflops")
	}
	m.addPerf([]*modelState{ms}, []modelStats{st}, items, 1e-9) // 1,000 FLOP/s
	if got, want := m[metric.PerfMFUModel("m")], 3*13440/2.0/1000; math.Abs(got-want) > 1e-9 {
		t.Errorf("MFU = %g, want %g", got, want)
	}
}
