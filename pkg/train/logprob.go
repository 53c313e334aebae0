package train

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch"
)

// logprobDiff compares, per engine-served model, the log-probs the engine reported for the sampled
// tokens with the trainer's own (items' old log-probs, filled here when the update does not need
// them): rollout/logprob_diff/<model>/{mean,max} of |engine − trainer| over the tokens. Rows sampled
// at a temperature other than 1 are left out (engines differ on whether they report log-probs before
// or after temperature). A replica whose mean gap exceeds models[].rollout.max_logprob_diff fails the
// iteration (ErrReplicaDiverged, naming it) before any update: its tokens were not sampled by the
// weights being trained; bound is the model's max_logprob_diff (its base's for an adapter), and
// onPolicy says the rollout was sampled by the current weights (a rollout generated ahead comes from
// older weights by design, rollout.max_staleness: measured, not judged). Runs on the torch thread.
func (ms *modelState) logprobDiff(items []*item, m Metrics, bound float64, onPolicy bool) error {
	if len(items) == 0 {
		return nil
	}
	var use []*item
	for _, x := range items {
		if ms.loss.agents[x.agent].behaviourKnown && len(x.served) == len(x.response) {
			use = append(use, x)
		}
	}
	if len(use) == 0 {
		return nil
	}
	var missing []*item
	for _, x := range use {
		if x.old == nil {
			missing = append(missing, x)
		}
	}
	if len(missing) > 0 {
		if err := ms.recordLogProbs(ms.pol, ms.loss.microBatches(missing, ms.loss.microBatch), func(x *item, lp []float32) { x.old = lp }); err != nil {
			return err
		}
	}
	var sum, worst float64
	n := 0
	perReplica := map[string]*replicaGap{}
	for _, x := range use {
		g := perReplica[x.replica]
		if g == nil {
			g = &replicaGap{}
			perReplica[x.replica] = g
		}
		for j := range x.response {
			d := math.Abs(float64(x.served[j]) - float64(x.old[j]))
			sum += d
			worst = max(worst, d)
			n++
			g.sum += d
			g.max = max(g.max, d)
			g.tokens++
		}
	}
	p := "rollout/logprob_diff/" + ms.id // per adapter for adapters on a served base
	m[p+"/mean"], m[p+"/max"] = sum/float64(n), worst
	if !onPolicy {
		return nil
	}
	return checkReplicaGaps(ms.id, perReplica, bound)
}

// ErrReplicaDiverged is wrapped by the error of an iteration whose served log-probs are too far from
// the trainer's (models[].rollout.max_logprob_diff).
var ErrReplicaDiverged = errors.New("served log-probs diverge from the trained weights")

// replicaGap is one replica's |served − trainer| log-prob over an iteration's tokens.
type replicaGap struct {
	sum, max float64
	tokens   int
}

// checkReplicaGaps fails when a replica's mean gap exceeds bound (0 = off), naming every such replica.
func checkReplicaGaps(model string, gaps map[string]*replicaGap, bound float64) error {
	if bound <= 0 {
		return nil
	}
	urls := make([]string, 0, len(gaps))
	for u := range gaps {
		urls = append(urls, u)
	}
	sort.Strings(urls)
	var bad []string
	for _, u := range urls {
		g := gaps[u]
		if mean := g.sum / float64(g.tokens); mean > bound || math.IsNaN(mean) {
			name := u
			if name == "" {
				name = "(in-process)"
			}
			bad = append(bad, fmt.Sprintf("replica %s: mean %.4g nats per token over %d tokens (largest %.4g)", name, mean, g.tokens, g.max))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: model %s: %s, beyond models[].rollout.max_logprob_diff %g: the replica does not sample with the weights being trained (a stale or failed reload, another model); not training on this rollout",
		ErrReplicaDiverged, model, strings.Join(bad, "; "), bound)
}

// recordLogProbs computes per-response-token log-probs under pol without grad, one forward per
// micro-batch (objective.microBatches), and hands each item its own (the old policy's or the
// reference's). Torch thread.
func (ms *modelState) recordLogProbs(pol *policy.Policy, mbs [][]*item, set func(*item, []float32)) error {
	return torch.NoGrad(func() error {
		for _, xs := range mbs {
			s := torch.NewScope()
			sc, err := pol.Score(ms.moe.sequences(xs), false)
			if err != nil {
				s.Close()
				return err
			}
			lp := sc.LogProbs.MustTotype(gotch.Float, false).MustTo(gotch.CPU, true).MustContiguous(true)
			rows := make([]float32, lp.Numel())
			torch.MustRead(lp, rows)
			width := int(sc.LogProbs.MustSize()[1])
			for i, x := range xs {
				set(x, append([]float32(nil), rows[i*width:i*width+len(x.response)]...))
			}
			s.Close()
		}
		return nil
	})
}
