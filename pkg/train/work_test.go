package train

import (
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/flops"
	"github.com/drmas/drmas/pkg/model"
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
	ms = &modelState{upd: updates{epochs: 1, miniBatches: 1}, cfg: model.Config{Base: "base"},
		loss: objective{agents: map[string]agentCoefs{"a": {entropy: 0.01}}}}
	w = ms.work()
	if _, fl := w.count(c, items); w.logProb != 0 || fl != 2*flops.AdapterPass*13440 {
		t.Errorf("adapter, on-policy, entropy: %g FLOPs (work %+v), want %d", fl, w, 2*2*13440)
	}
}

// work counts this rank's calls only (another rank's are remote), over the model's own update time.
func TestWorkThisRank(t *testing.T) {
	c := arch.Config{HiddenSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 4, IntermediateSize: 16, VocabSize: 10}
	ms := &modelState{id: "m", pol: &policy.Policy{Device: gotch.CPU, Model: &policy.Model{Config: c}},
		upd: updates{epochs: 1, miniBatches: 1}, loss: objective{agents: map[string]agentCoefs{"a": {}}}}
	items := map[string][]*item{"m": {
		{agent: "a", prompt: []int{1, 2, 3}, response: []int{4, 5}, adv: 1},
		{agent: "a", prompt: []int{1, 2, 3}, response: []int{4, 5}, adv: 1, remote: true},
	}}
	st := modelStats{times: updateTimes{fwdBwd: 1500 * time.Millisecond, optimizer: 500 * time.Millisecond}}
	tr := &Trainer{models: []*modelState{ms}}
	w := tr.work([]modelStats{st}, items)
	if len(w) != 1 || w[0].Tokens != 5 || w[0].Seconds != 2 || w[0].FLOPs != 3*13440 || w[0].Device != "cpu" {
		t.Errorf("work = %+v, want this rank's one call: 5 tokens, one training pass, 2 s on the CPU", w)
	}
}
