package train

// What an update runs, in model FLOPs (pkg/flops), for the reporter's throughput and MFU.

import (
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/flops"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/report"
	"github.com/drmas/drmas/pkg/torch"
)

// total is the model's whole update time.
func (t updateTimes) total() float64 {
	return (t.oldLogProb + t.refLogProb + t.fwdBwd + t.optimizer).Seconds()
}

// work is each model's work in the iteration's update on this rank, for its throughput and MFU
// (pkg/report): its calls' tokens and model FLOPs over its own update time.
func (t *Trainer) work(stats []modelStats, perModel map[string][]*item) []report.Work {
	var out []report.Work
	for i, ms := range t.models {
		items := localItems(perModel[ms.id])
		if len(items) == 0 || ms.pol == nil || ms.pol.Model == nil {
			continue
		}
		tokens, fl := ms.work().count(ms.pol.Model.Config, items)
		out = append(out, report.Work{Model: ms.id, Tokens: tokens, FLOPs: fl, Seconds: stats[i].times.total(),
			Device: torch.DeviceString(ms.pol.Device), DType: policy.DTypeName(ms.pol.Model.DType())})
	}
	return out
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
