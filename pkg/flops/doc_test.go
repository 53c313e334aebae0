package flops

import (
	"math"
	"testing"

	"github.com/drmas/drmas/pkg/arch"
)

// A small config by hand: h 8, 2 layers, 2 heads of dim 4 (q 8), 1 kv head (kv 4), intermediate 16,
// vocab 10. Per layer: q 8·8 = 64, k and v 8·4 = 32 each, o 8·8 = 64, gate/up/down 3·8·16 = 384:
// 576; N = 2·576 = 1,152. A sequence of 5 tokens with 2 scored: projections 2·1,152·5 = 11,520,
// lm_head 2·10·8·2 = 320, attention 4·2·8·25 = 1,600: 13,440 forward, 40,320 for a training pass.
func TestForwardByHand(t *testing.T) {
	c := arch.Config{HiddenSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 4, IntermediateSize: 16, VocabSize: 10}
	if got := LayerParams(c); got != 1152 {
		t.Errorf("LayerParams = %g, want 1152", got)
	}
	if got := Forward(c, 5, 2); got != 13440 {
		t.Errorf("Forward(5, 2) = %g, want 13440", got)
	}
	if got := TrainPass * Forward(c, 5, 2); got != 40320 {
		t.Errorf("training pass = %g, want 40320", got)
	}
}

// Qwen3-0.6B (configs/models/qwen3-0.6b.json): the layers' projections are its parameters less the
// embedding (tied) and the norms: 596,049,920 − 151,936·1,024 − (28·(2·1,024 + 2·128) + 1,024) =
// 440,401,920. At one token with nothing scored, the forward is 2·N plus the 1×1 attention.
func TestQwen3LayerParams(t *testing.T) {
	c, err := arch.ReadConfig("../../configs/models/qwen3-0.6b.json")
	if err != nil {
		t.Fatal(err)
	}
	p, err := arch.ParamCount(c)
	if err != nil {
		t.Fatal(err)
	}
	norms := int64(c.NumHiddenLayers*(2*c.HiddenSize+2*c.HeadDim) + c.HiddenSize)
	want := float64(p - int64(c.VocabSize*c.HiddenSize) - norms)
	if got := LayerParams(c); got != want || want != 440401920 {
		t.Errorf("LayerParams = %.0f, want %.0f (= 440,401,920)", got, want)
	}
	attn := 4 * float64(c.NumHiddenLayers*c.NumAttentionHeads*c.HeadDim)
	if got := Forward(c, 1, 0); got != 2*want+attn {
		t.Errorf("Forward(1, 0) = %.0f, want %.0f", got, 2*want+attn)
	}
}

func TestGPUPeak(t *testing.T) {
	for _, tc := range []struct {
		name, dtype string
		want        float64
		ok          bool
	}{
		{"NVIDIA H200", "bfloat16", 989, true},
		{"NVIDIA H20", "bfloat16", 148, true},
		{"NVIDIA H100 80GB HBM3", "bfloat16", 989, true},
		{"NVIDIA H100 PCIe", "float16", 756, true},
		{"NVIDIA A100-SXM4-80GB", "bfloat16", 312, true},
		{"NVIDIA A10G", "bfloat16", 70, true},
		{"NVIDIA A100-SXM4-80GB", "float32", 19.5, true},
		{"NVIDIA GeForce GTX 1080", "bfloat16", 0, false},
		{"NVIDIA H200", "int8", 0, false},
	} {
		got, ok := GPUPeakTFLOPS(tc.name, tc.dtype)
		if got != tc.want || ok != tc.ok {
			t.Errorf("GPUPeakTFLOPS(%q, %s) = %g, %v; want %g, %v", tc.name, tc.dtype, got, ok, tc.want, tc.ok)
		}
	}
	if got := MFU(989e12, 2, 989); math.Abs(got-0.5) > 1e-12 {
		t.Errorf("MFU = %g, want 0.5", got)
	}
	if MFU(1, 1, 0) != 0 {
		t.Error("MFU without a peak should be 0")
	}
}
