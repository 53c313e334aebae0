package report

// Throughput and MFU per model (perf/tokens_per_s/<id>, perf/mfu/<id>): the model FLOPs of what its
// update ran (the loop counts them: Work) over the seconds it took, against its device's peak.

import (
	"errors"
	"sync"

	"github.com/drmas/drmas/pkg/flops"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/rs/zerolog/log"
)

// Work is what one model's update ran in an iteration, on this rank: its sequence tokens (prompt +
// response, each call once), its model FLOPs (pkg/flops), the seconds the update took, and the device
// and weights dtype it ran on.
type Work struct {
	Model         string
	Tokens, FLOPs float64
	Seconds       float64
	Device, DType string
}

// addPerf writes each model's tokens per second and, where its device's peak is known (peak > 0
// from run.peak_tflops, else pkg/flops' table for a GPU nvidia-smi names), its MFU, both over the
// model's own update time.
func addPerf(m metric.Row, work []Work, peak float64) {
	for _, w := range work {
		if w.Seconds <= 0 || w.Tokens == 0 {
			continue
		}
		m[metric.PerfTokensPerSModel(w.Model)] = w.Tokens / w.Seconds
		if p := devicePeak(w.Device, w.DType, peak); p > 0 {
			m[metric.PerfMFUModel(w.Model)] = flops.MFU(w.FLOPs, w.Seconds, p)
		}
	}
}

// peaks caches each device's peak (nvidia-smi is asked once per device and dtype).
var peaks sync.Map // device + "/" + dtype → float64

// gpuName names the GPU of a CUDA device (nvidia-smi's name; Run.GPUName; tests replace it).
var gpuName = func(string) (string, error) { return "", errors.New("no GPU names known") }

// devicePeak is the peak TFLOP/s of device for weights of dtype: override when > 0, else the table's
// figure for the GPU nvidia-smi names; 0 (no MFU) for a CPU or an unknown GPU.
func devicePeak(device, dtype string, override float64) float64 {
	if override > 0 {
		return override
	}
	if device == "cpu" {
		return 0
	}
	key := device + "/" + dtype
	if p, ok := peaks.Load(key); ok {
		return p.(float64)
	}
	var p float64
	name, err := gpuName(device)
	if err == nil {
		var ok bool
		if p, ok = flops.GPUPeakTFLOPS(name, dtype); !ok {
			log.Info().Str("device", device).Str("gpu", name).Str("dtype", dtype).Msg("no peak FLOP/s known for this GPU: no perf/mfu (set run.peak_tflops)")
		}
	} else {
		log.Info().Err(err).Str("device", device).Msg("GPU name unknown: no perf/mfu (set run.peak_tflops)")
	}
	peaks.Store(key, p)
	return p
}
