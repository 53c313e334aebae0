package bench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/plan"
)

// stepShape is the largest micro-batch of the training step: rows of t tokens, r of them response.
func (o Options) stepShape() (b, t, r int64) {
	r = int64(o.ResponseLen)
	if len(o.ResponseLengths) > 0 {
		r = int64(slices.Max(o.ResponseLengths))
	}
	t, b = int64(o.PromptLen)+r, int64(o.Batch)
	switch {
	case o.MaxTokensPerMicroBatch > 0: // as many rows of the longest length as the budget holds (pkg/plan)
		b = min(b, max(1, max(int64(o.MaxTokensPerMicroBatch), t)/t))
	case o.MicroBatch > 0:
		b = min(b, int64(o.MicroBatch))
	}
	return b, t, r
}

// PlanPeak is the memory plan's peak of Run with o on a model of config c whose weights take
// dtypeBytes each (cpu: the CPU's overhead): the training step's largest micro-batch (pkg/plan.Step,
// drmas train's formulas) or, when larger, the generation's KV cache (GenBatch or Batch rows of the
// prompt and the longest response), over the static state and the runtime.
func PlanPeak(c arch.Config, dtypeBytes int64, o Options, cpu bool) int64 {
	b, t, r := o.stepShape()
	s := plan.Step(c, dtypeBytes, b, t, r, o.Checkpointing, cpu)
	rows := int64(o.Batch)
	if o.GenBatch > 0 {
		rows = min(rows, int64(o.GenBatch))
	}
	var kv int64
	if !o.NoGenerate {
		kv = 2 * int64(c.NumHiddenLayers) * rows * t * int64(c.NumKeyValueHeads*c.HeadDim) * dtypeBytes
	}
	return s.Static + max(s.Update, kv) + s.Overhead
}

// CheckMemory refuses a benchmark whose planned peak (PlanPeak) exceeds the memory of device (its
// capacity, plan.Probe: MemAvailable on the CPU), naming the changes that make it fit: gradient
// checkpointing, the largest micro-batch (halves of the batch) that fits, with or without it. A
// device whose memory cannot be asked is not checked.
func CheckMemory(c arch.Config, dtypeBytes int64, o Options, device string) error {
	capacity, source, err := plan.Probe(device)
	cpu := device == "cpu"
	peak := PlanPeak(c, dtypeBytes, o, cpu)
	if err != nil || peak <= capacity {
		return nil
	}
	b, t, _ := o.stepShape()
	var fixes []string
	if !o.Checkpointing {
		if p := PlanPeak(c, dtypeBytes, withCheckpointing(o), cpu); p <= capacity {
			fixes = append(fixes, fmt.Sprintf("--checkpointing (peak %s)", plan.Bytes(p)))
		}
	}
	if o.MaxTokensPerMicroBatch == 0 {
		for _, ckpt := range []bool{o.Checkpointing, true} {
			if m, p, ok := fittingMicroBatch(c, dtypeBytes, o, ckpt, cpu, capacity); ok {
				fix := fmt.Sprintf("--micro-batch %d (peak %s)", m, plan.Bytes(p))
				if ckpt && !o.Checkpointing {
					fix = fmt.Sprintf("--checkpointing --micro-batch %d (peak %s)", m, plan.Bytes(p))
				}
				fixes = append(fixes, fix)
				break
			}
		}
	}
	hint := "no micro-batch or checkpointing fits: fewer generation rows in flight (--gen-batch), a shorter --prompt-len or response, or a smaller model"
	if len(fixes) > 0 {
		hint = "it fits with " + strings.Join(fixes, ", or ")
	}
	return fmt.Errorf("the benchmark's memory plan needs %s at its peak (a micro-batch of %d × %d tokens%s), more than the %s of %s (%s); %s; --memory-check=false runs it anyway",
		plan.Bytes(peak), b, t, ckptNote(o.Checkpointing), plan.Bytes(capacity), device, source, hint)
}

func withCheckpointing(o Options) Options {
	o.Checkpointing = true
	return o
}

// fittingMicroBatch is the largest micro-batch, in halves of the batch, whose plan fits capacity.
func fittingMicroBatch(c arch.Config, e int64, o Options, ckpt, cpu bool, capacity int64) (int, int64, bool) {
	o.Checkpointing = ckpt
	for m := o.Batch / 2; m >= 1; m /= 2 {
		if o.MicroBatch > 0 && m >= o.MicroBatch {
			continue
		}
		o.MicroBatch = m
		if p := PlanPeak(c, e, o, cpu); p <= capacity {
			return m, p, true
		}
	}
	return 0, 0, false
}

func ckptNote(on bool) string {
	if on {
		return ", checkpointing on"
	}
	return ""
}
