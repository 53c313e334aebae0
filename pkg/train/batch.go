package train

import (
	"math/rand/v2"
	"strings"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/normalize"
)

// item is one agent call turned into a training sequence.
type item struct {
	agent    string
	traj     int // index of its trajectory in the rollout
	prompt   []int
	response []int
	adv      float64
	sample   int         // its index in the rollout's samples
	lw       float64     // its loss weight (algorithm.balance_loss_by_agent_freq; unused when off)
	old, ref []float32   // per response token; recorded before the updates when needed
	served   []float32   // the log-probs the generator reported (an engine's: compared with old)
	replica  string      // the engine replica that sampled it ("" in-process)
	routes   *llm.Routes // a mixture-of-experts model's: the experts the generator routed its tokens to
	// remote: another rank rolled this call out and trains on it (data-parallel); this rank only
	// counts it in the mini-batch's denominators.
	remote bool
}

// miniBatch is the data of one optimizer step.
type miniBatch struct {
	items []*item
	denom Denominators // the mini-batch totals each micro-batch's loss is divided by
	// onPolicy: the weights are those that sampled the calls, so the old log-probs are the current
	// ones, detached (item.old is not recorded).
	onPolicy bool
}

func newMiniBatch(items []*item, horizon float64, onPolicy bool) miniBatch {
	d := Denominators{Seqs: float64(len(items)), Horizon: horizon}
	for _, x := range items {
		d.Tokens += float64(len(x.response))
	}
	return miniBatch{items: items, denom: d, onPolicy: onPolicy}
}

// batch returns the tasks of an iteration: consecutive slices of a permutation of the training set
// that is redrawn each epoch from (seed, epoch). A pure function of the iteration, so a resumed run
// sees the same tasks.
func (t *Team) batch(iteration int) (tasks []env.Task, epoch int) {
	n := len(t.Train)
	bs := t.plan.batchSize
	start := (iteration - 1) * bs
	for i := 0; i < bs; i++ {
		pos := start + i
		e := pos / n
		perm := rand.New(rand.NewPCG(uint64(t.plan.seed), uint64(e))).Perm(n)
		tasks = append(tasks, t.Train[perm[pos%n]])
		epoch = e
	}
	return tasks, epoch + 1
}

// localItems are the items this rank trains on (all of them in one process; see parallel.trainsOn).
func localItems(items []*item) []*item {
	out := make([]*item, 0, len(items))
	for _, x := range items {
		if !x.remote {
			out = append(out, x)
		}
	}
	return out
}

// normSamples are the rollout's samples as pkg/normalize takes them.
func normSamples(samples []env.Sample) []normalize.Sample {
	ns := make([]normalize.Sample, len(samples))
	for i, s := range samples {
		ns[i] = normalize.Sample{UID: s.UID, TrajUID: s.TrajUID, Agent: s.Agent, Score: s.Score}
	}
	return ns
}

// itemsByModel turns the calls of a rollout into training sequences per model group, with their
// advantages (aligned with samples). Calls without response tokens are skipped. mine says, per
// trajectory, whether this rank trains on its calls (nil: every one).
func (t *Team) itemsByModel(roll *env.Rollout, samples []env.Sample, adv []float64, mine []bool) map[string][]*item {
	out := map[string][]*item{}
	for i, s := range samples {
		call := roll.Trajectories[s.Traj].Calls[s.Call]
		if len(call.ResponseIDs) == 0 {
			continue
		}
		m := t.plan.modelOf[s.Agent]
		out[m] = append(out[m], &item{agent: s.Agent, traj: s.Traj, sample: i, prompt: call.PromptIDs, response: call.ResponseIDs, adv: adv[i], served: call.LogProbs, replica: call.Replica,
			routes: call.Routes, remote: mine != nil && !mine[s.Traj]})
	}
	return out
}

// seqTokens counts the prompt and response tokens of the items.
func seqTokens(perModel map[string][]*item) int {
	n := 0
	for _, items := range perModel {
		for _, x := range items {
			n += len(x.prompt) + len(x.response)
		}
	}
	return n
}

// padded returns a [len(items), width] float32 tensor of per-token values (zero-padded).
func padded(items []*item, width int, get func(*item) []float32, dev gotch.Device) *ts.Tensor {
	flat := make([]float32, len(items)*width)
	for i, x := range items {
		copy(flat[i*width:], get(x))
	}
	return ts.MustOfSlice(flat).MustView([]int64{int64(len(items)), int64(width)}, true).MustTo(dev, true)
}

// render decodes a prompt's tokens with the tokenizer of the call's model: the text it read.
func (t *Team) render(model string, ids []int) string {
	if p := t.Router[model]; p != nil && p.Tok != nil {
		return strings.ToValidUTF8(string(p.Tok.DecodeBytes(ids)), "\uFFFD")
	}
	return ""
}
