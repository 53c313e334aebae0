package flops

import "strings"

// A GPU's dense peak (no structured sparsity), in TFLOP/s, for half-precision (bfloat16/float16)
// tensor-core products and for float32 products without TF32, as the vendors' data sheets give them
// (SXM parts where a PCIe variant differs; verl's flops_counter uses the same half-precision figures).
type gpuPeak struct {
	match      string // a substring of nvidia-smi's name, upper case
	half, fp32 float64
}

// gpuPeaks is matched in order: a longer name before one it contains (H200 before H20, A100 before A10).
var gpuPeaks = []gpuPeak{
	{"B200", 2250, 80},
	{"H200", 989, 67},
	{"H100 PCIE", 756, 51},
	{"H100", 989, 67},
	{"H800", 989, 67},
	{"H20", 148, 44},
	{"A100", 312, 19.5},
	{"A800", 312, 19.5},
	{"L40S", 362, 91.6},
	{"L40", 181, 90.5},
	{"L4", 121, 30.3},
	{"A10G", 70, 31.2},
	{"A10", 125, 31.2},
	{"MI300X", 1307, 163},
}

// GPUPeakTFLOPS is the dense peak of the GPU nvidia-smi names (e.g. "NVIDIA H200") for weights of
// dtype ("bfloat16", "float16" or "float32"); ok is false for a GPU or dtype not in the table.
func GPUPeakTFLOPS(name, dtype string) (tflops float64, ok bool) {
	n := strings.ToUpper(name)
	for _, p := range gpuPeaks {
		if strings.Contains(n, p.match) {
			switch dtype {
			case "bfloat16", "float16":
				return p.half, true
			case "float32":
				return p.fp32, true
			}
			return 0, false
		}
	}
	return 0, false
}

// MFU is the fraction of the device's peak a piece of work used: flops done in seconds, against
// peakTFLOPS. 0 when the peak or the time is unknown.
func MFU(flops, seconds, peakTFLOPS float64) float64 {
	if peakTFLOPS <= 0 || seconds <= 0 {
		return 0
	}
	return flops / seconds / (peakTFLOPS * 1e12)
}
