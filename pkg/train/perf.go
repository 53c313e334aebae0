package train

// Throughput and MFU per model (perf/tokens_per_s/<id>, perf/mfu/<id>): the model FLOPs of what its
// update ran (pkg/flops) over the seconds it took, against its device's peak.

import (
	"sync"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/flops"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/plan"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/rs/zerolog/log"
)

// total is the model's whole update time.
func (t updateTimes) total() float64 {
	return (t.oldLogProb + t.refLogProb + t.fwdBwd + t.optimizer).Seconds()
}

// addPerf writes each model's tokens per second and, where its device's peak is known (peak > 0
// from run.peak_tflops, else pkg/flops' table for a GPU nvidia-smi names), its MFU, both over the
// model's own update time (this rank's calls and time). Call it with the iteration's items per
// model and each model's stats, after the update.
func (m Metrics) addPerf(models []*modelState, stats []modelStats, perModel map[string][]*item, peak float64) {
	for i, ms := range models {
		sec := stats[i].times.total()
		items := localItems(perModel[ms.id])
		if sec <= 0 || len(items) == 0 || ms.pol == nil || ms.pol.Model == nil {
			continue
		}
		w := ms.work()
		tokens, fl := w.count(ms.pol.Model.Config, items)
		m[metric.PerfTokensPerSModel(ms.id)] = tokens / sec
		if p := devicePeak(torch.DeviceString(ms.pol.Device), policy.DTypeName(ms.pol.Model.DType()), peak); p > 0 {
			m[metric.PerfMFUModel(ms.id)] = flops.MFU(fl, sec, p)
		}
	}
}

// work is what a model's update runs on each call, in forward passes (pkg/flops' units).
type work struct {
	train   float64          // per training pass: flops.TrainPass, or AdapterPass for a LoRA adapter
	epochs  int              // training passes over each call (ppo_epochs: each call is in one mini-batch per epoch)
	logProb int              // log-prob passes: the old policy's (recomputed unless on-policy) and the reference's
	trained func(*item) bool // whether a call runs forward and backward (withSignal leaves zero-advantage calls out)
}

// work mirrors update and agentBackward (step.go): the old log-probs are recomputed unless one
// update per iteration makes them the current ones; the reference's when there is one; a call
// whose advantage is zero is left out of the backward when its agent has no entropy or KL term.
func (ms *modelState) work() work {
	w := work{train: flops.TrainPass, epochs: ms.upd.epochs}
	if ms.cfg.IsAdapter() {
		w.train = flops.AdapterPass
	}
	if !(ms.upd.epochs == 1 && ms.upd.miniBatches == 1) {
		w.logProb++
	}
	if ms.ref != nil {
		w.logProb++
	}
	w.trained = func(x *item) bool {
		c := ms.loss.agents[x.agent]
		return x.adv != 0 || c.entropy != 0 || (c.kl != 0 && ms.ref != nil)
	}
	return w
}

// count is the sequence tokens (prompt + response, each call once) and the model FLOPs of the
// update on items.
func (w work) count(c arch.Config, items []*item) (tokens, fl float64) {
	for _, x := range items {
		s, r := len(x.prompt)+len(x.response), len(x.response)
		tokens += float64(s)
		passes := float64(w.logProb)
		if w.trained == nil || w.trained(x) {
			passes += w.train * float64(w.epochs)
		}
		fl += passes * flops.Forward(c, s, r)
	}
	return tokens, fl
}

// peaks caches each device's peak (nvidia-smi is asked once per device and dtype).
var peaks sync.Map // device + "/" + dtype → float64

// gpuName asks nvidia-smi (tests replace it).
var gpuName = plan.GPUName

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
