package plan

import (
	"slices"
	"strings"
)

// Device is what one device holds at its peak: the models' static memory, plus the larger of the
// training update (one model at a time) and the rollout (one Generate call at a time, with every
// local model's decoding layout), plus the runtime.
type Device struct {
	Device string   `json:"device"`
	Models []string `json:"models"`
	Ranks  int      `json:"ranks"` // processes whose memory the device holds (CPU: --nproc)
	Parts
	// HeldPhase is the largest phase over the held heap (heap_held_bytes + that phase's mapped
	// tensors; 0 on CUDA): the peak is static + max(update, rollout, HeldPhase) + runtime.
	HeldPhase      int64  `json:"held_phase_bytes"`
	PeakBytes      int64  `json:"peak_bytes"`
	CapacityBytes  int64  `json:"capacity_bytes"`  // 0: unknown
	CapacitySource string `json:"capacity_source"` // how the capacity was found
	Fits           *bool  `json:"fits"`            // nil: the capacity is unknown
	// Fix, when the plan does not fit, is the smallest change of config keys that makes it fit, if
	// the plan found one (see fix): FixSets as --set arguments, Fix as text with the peak it gives.
	// Alternatives are other changes of the same size that fit.
	Fix          string   `json:"fix,omitempty"`
	FixSets      []string `json:"fix_sets,omitempty"`
	FixPeak      int64    `json:"fix_peak_bytes,omitempty"`
	Alternatives []string `json:"fix_alternatives,omitempty"`
}

// group sums the models into devices; the host ("cpu") also holds ahead, the rollouts generated
// ahead of training.
func (pl *Plan) group(opt Options, ahead int64) {
	byDev := map[string]*Device{}
	for _, m := range pl.Models {
		d := byDev[m.Device]
		if d == nil {
			d = &Device{Device: m.Device, Ranks: 1}
			if m.Device == "cpu" && opt.HostRanks > 1 {
				d.Ranks = opt.HostRanks
			}
			byDev[m.Device] = d
			pl.Devices = append(pl.Devices, *d)
		}
		d.Models = append(d.Models, m.ID)
	}
	// Offloaded optimizer state lives in host memory: the "cpu" device holds it, whether or not a
	// model runs there.
	for _, m := range pl.Models {
		if m.Offloaded == 0 {
			continue
		}
		d := byDev["cpu"]
		if d == nil {
			d = &Device{Device: "cpu", Ranks: max(opt.HostRanks, 1)}
			byDev["cpu"] = d
			pl.Devices = append(pl.Devices, *d)
		}
		d.Models = append(d.Models, m.ID+" (offloaded optimizer)")
	}
	if ahead > 0 && byDev["cpu"] == nil {
		d := &Device{Device: "cpu", Ranks: max(opt.HostRanks, 1)}
		byDev["cpu"] = d
		pl.Devices = append(pl.Devices, *d)
	}
	for i := range pl.Devices {
		d := byDev[pl.Devices[i].Device]
		if d.Device == "cpu" && ahead > 0 {
			d.Models = append(d.Models, "rollouts ahead")
		}
		d.sum(pl.Models, ahead)
		pl.Devices[i] = *d
	}
	slices.SortFunc(pl.Devices, func(a, b Device) int { return strings.Compare(a.Device, b.Device) })
}

// phase names the device's peak: the update, the rollout, or one of them over the held heap (or,
// sharded, loading a model).
func (d Device) phase() string {
	h := d.heldPhases()
	if d.Load > d.Static+max(d.Update, d.Rollout, h) {
		return "load of a whole model, before it is cut into shards"
	}
	if h <= max(d.Update, d.Rollout) {
		if d.Rollout > d.Update {
			return "rollout"
		}
		return "update"
	}
	switch h - d.Held {
	case d.StepMapped + d.Reduce:
		return "optimizer step over the held heap"
	case d.RolloutKV - d.KVHeap + d.DecodeCopy - d.DecodeHeap + d.RolloutGathered:
		return "rollout over the held heap"
	}
	return "update over the held heap"
}

// sum works out the device's parts from its models: static memory adds up; the update phase is the
// largest model's (models are updated one after another, pkg/train/step.go); the rollout is the
// largest Generate call's KV cache (agents generate one after another, pkg/env/orchestra.go) with
// every local model's decoding layout. The host ("cpu") also holds the offloaded optimizer state of
// models on other devices, and their AdamW steps run there (one model's at a time, as updates).
func (d *Device) sum(models []Model, ahead int64) {
	var p Parts
	if d.Device == "cpu" {
		p.Ahead = ahead
	}
	var kv, load int64
	for _, m := range models {
		if m.Device != d.Device {
			if d.Device == "cpu" && m.Offloaded > 0 {
				p.Offloaded += m.Offloaded
				if m.OffloadStep > p.Update {
					p.Activations, p.Attention, p.Logits, p.Reduce = 0, 0, 0, 0
					p.OptimStep, p.Update = m.OffloadStep, m.OffloadStep
				}
			}
			continue
		}
		p.Weights += m.Weights
		p.Master += m.Master
		p.Gradients += m.Gradients
		p.Optimizer += m.Optimizer
		p.Reference += m.Reference
		p.DecodeCopy += m.DecodeCopy
		if m.Update > p.Update {
			p.Activations, p.Attention, p.Logits, p.OptimStep, p.Reduce, p.Update = m.Activations, m.Attention, m.Logits, m.OptimStep, m.Reduce, m.Update
			p.StepMapped, p.Gathered = m.StepMapped, m.Gathered
		}
		// Sharded weights: one model's units at a time in the rollout, or every model whole
		// (dist.rollout_gather: model: the rollout holds all of them); one model loads at a time.
		if m.in.gatherWhole {
			p.RolloutGathered += m.RolloutGathered
		} else {
			p.RolloutGathered = max(p.RolloutGathered, m.RolloutGathered)
		}
		load = max(load, m.Load)
		p.UpdateHeap = max(p.UpdateHeap, m.UpdateHeap) // the updates, one after another, reuse the heap
		p.DecodeHeap += m.DecodeHeap
		if m.RolloutKV > kv {
			p.KVHeap = m.KVHeap
		}
		kv = max(kv, m.RolloutKV)
	}
	p.RolloutKV = kv
	p.total()
	p.Overhead = CPUOverhead
	if d.Device != "cpu" {
		p.Overhead = CUDAOverhead
	}
	d.Parts = p
	d.HeldPhase = p.heldPhases()
	if load > 0 { // sharded weights: every model's shards and the whole model being cut
		p.Load = p.Weights + load
	}
	d.Parts = p
	d.PeakBytes = satMul(int64(d.Ranks), satSum(max(satSum(p.Static, max(p.Update, p.Rollout, d.HeldPhase)), p.Load), p.Overhead))
}
