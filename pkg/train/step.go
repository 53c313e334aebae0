package train

// The training step, read top to bottom: each function calls the next one below it.
//
//	iteration       rollout → advantages → per model: update → [after the update] → metrics
//	update          old / reference log-probs; ppo_epochs × ppo_mini_update_num mini-batches
//	optimizerStep   zero → backward (parallel) → [gradients complete] → norm → skip or clip → AdamW step
//	backward        agent by agent: its micro-batches (agentBackward), then the gradient norm of its share
//	microBatchLoss  forward; clipped policy-gradient loss (+ entropy bonus, KL penalty); backward

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/report"
	"github.com/drmas/drmas/pkg/torch"
)

// iteration runs one training iteration and returns what it reports.
func (t *Trainer) iteration(ctx context.Context, it int) (report.Iteration, error) {
	began := time.Now()

	// 1. Rollout: group_size episodes of each of the iteration's tasks, through the policies the
	// engines serve, made current first (publish). Data-parallel: each rank plays its share of the
	// tasks and every rank gets the whole rollout. The source may have generated it ahead (its
	// Version: the weights that did).
	if err := t.engines.Sync(ctx, t.step); err != nil {
		return report.Iteration{}, fmt.Errorf("iteration %d: %w", it, err)
	}
	g := t.par.group()
	comm0 := g.CommTime()
	roll, epoch, err := t.source.Next(ctx, it, t.step)
	if err != nil {
		return report.Iteration{}, fmt.Errorf("iteration %d: rollout: %w", it, err)
	}
	if roll.Version != t.step {
		t.report.Show(it, 0.5, fmt.Sprintf("rollout generated ahead by weights version %d", roll.Version))
	}
	rolloutTime := time.Since(began)
	if err := t.report.Rollout(it, roll); err != nil {
		return report.Iteration{}, err
	}

	// 2. Advantages: each call's score (less a KL penalty, with kl_in_reward) normalized within its
	// group (global GRPO, agent-wise Dr. MAS...). With them, from the same grouping of the calls, the
	// Lemma 4.2 energy ratio ΣA²(GRPO)/ΣA²(Dr. MAS) per agent on this rollout and the reference code's
	// diagnostics, whatever the estimator. t.norm was resolved (and checked) once, in New.
	m := Metrics{"step": float64(it), "epoch": float64(epoch)}
	samples := roll.Samples()
	adv, perModel, err := t.advantages(roll, samples, m)
	if err != nil {
		return report.Iteration{}, fmt.Errorf("iteration %d: advantages: %w", it, err)
	}
	noSignal(it, adv.Advantages)

	// 3. Update: each model group trains on its own agents' calls, on the torch thread, after the
	// engine's log-probs are compared with its own. Data-parallel: each rank on its own calls.
	updateBegan := time.Now()
	stats := make([]modelStats, len(t.models))
	err = torch.Do(func() error {
		for i, ms := range t.models {
			if t.engines.Serves(ms.id) {
				if err := ms.logprobDiff(perModel[ms.id], m, t.Config.SampledBy(ms.cfg).Rollout.MaxLogprobDiff, roll.Version == t.step); err != nil {
					return err
				}
			}
			var err error
			if stats[i], err = ms.update(perModel[ms.id], it, t.report.MiniBatch(it, ms.id, i, len(t.models))); err != nil {
				return err
			}
		}
		torch.ReleaseMemory() // trims the C heap only once it holds a lot of free memory
		return nil
	})
	if err != nil {
		return report.Iteration{}, err
	}
	updateTime := time.Since(updateBegan)
	// After the update: every model has taken this iteration's steps; the source settles what it
	// generated meanwhile, and the next rollout samples from the new weights.
	if err := t.source.Updated(ctx, it, m); err != nil {
		return report.Iteration{}, fmt.Errorf("iteration %d: %w", it, err)
	}

	// 4. Metrics (keys: docs/contracts.md).
	m.addRollout(roll)
	m.addAdvantages(adv.Stats, adv.EnergyRatios)
	m.addDiagnostics(adv.Diagnostics)
	m.addModels(t.models, stats)
	m.addTimes(rolloutTime, updateTime, time.Since(began), seqTokens(perModel))
	m.addUpdateTimes(stats)
	t.engines.Metrics(m)
	m.addComm(g, comm0)
	return report.Iteration{Metrics: metric.Row(m), Advantages: byAgent(samples, adv.Advantages), Work: t.work(stats, perModel)}, nil
}

// noSignal says so when an iteration's every advantage is zero (each group's scores equal).
func noSignal(it int, advs []float64) {
	if len(advs) > 0 && !slices.ContainsFunc(advs, func(a float64) bool { return a != 0 }) {
		log.Info().Int("iteration", it).Int("calls", len(advs)).Msg("no signal: every advantage is zero (each group's scores are equal); " +
			"calls without a KL or entropy term are left out of the backward (update/idle_calls)")
	}
}

// update trains one model group on its agents' calls of this iteration: ppo_epochs passes over
// them, each split into ppo_mini_update_num mini-batches of one optimizer step each. Torch thread.
func (ms *modelState) update(items []*item, it int, done func(k, m int)) (modelStats, error) {
	stats := modelStats{agentNorms: map[string][]float64{}, spikes: map[string]int{}, nonfiniteShares: map[string]int{}, agentTokens: map[string]*tokenCounts{}}
	if ms.correcting() {
		stats.corr = map[string]*corrStats{}
	}
	if len(items) == 0 {
		return stats, corrOver(stats.corr, ms.agents, ms.par)
	}
	// With one update per iteration the old policy is the current one: its log-probs are the detached
	// log-probs of the same forward pass (verl recomputes them; the values are equal).
	onPolicy := ms.upd.epochs == 1 && ms.upd.miniBatches == 1
	mine := localItems(items)
	began := time.Now()
	if !onPolicy && missing(mine, func(x *item) []float32 { return x.old }) {
		if err := ms.recordLogProbs(ms.pol, ms.loss.microBatches(mine, ms.loss.microBatch), func(x *item, lp []float32) { x.old = lp }); err != nil {
			return stats, err
		}
	}
	stats.times.oldLogProb = time.Since(began)
	if ms.ref != nil && missing(mine, func(x *item) []float32 { return x.ref }) {
		began = time.Now()
		if err := ms.recordLogProbs(ms.ref, ms.loss.microBatches(mine, ms.loss.microBatch), func(x *item, lp []float32) { x.ref = lp }); err != nil {
			return stats, err
		}
		stats.times.refLogProb = time.Since(began)
	}
	for epoch := 0; epoch < ms.upd.epochs; epoch++ {
		order := rand.New(rand.NewPCG(ms.upd.seed, uint64(it*1000+epoch))).Perm(len(items))
		n := ms.upd.miniBatches
		for k := 0; k < n; k++ {
			lo, hi := k*len(order)/n, (k+1)*len(order)/n
			if hi == lo {
				continue
			}
			chunk := make([]*item, 0, hi-lo)
			for _, i := range order[lo:hi] {
				chunk = append(chunk, items[i])
			}
			t0 := time.Now()
			st, err := ms.optimizerStep(newMiniBatch(chunk, ms.horizon, onPolicy), it)
			if err != nil {
				return stats, err
			}
			st.stepTime = time.Since(t0) - st.backwardTime // the norm, the clip and AdamW
			stats.add(st)
			done(epoch*n+k+1, ms.upd.epochs*n)
		}
	}
	// Data-parallel: the loss terms and token counts are sums over this rank's calls; the norms,
	// skips and steps are already the same on every rank.
	if err := stats.sumOver(ms.par.sum, ms.agents, ms.moe); err != nil {
		return stats, err
	}
	return stats, corrOver(stats.corr, ms.agents, ms.par)
}

// optimizerStep takes one AdamW step on a mini-batch. A non-finite gradient norm skips the step and
// zeroes the gradients; max_nonfinite_steps of those in a row abort the run.
func (ms *modelState) optimizerStep(mb miniBatch, it int) (stepStats, error) {
	began := time.Now()
	ZeroGrad(ms.params)
	kept, release := ms.par.grads(ms.id, ms.params) // sharded gradients: this rank's partition
	st, err := ms.backward(mb, kept)
	release()
	if err != nil {
		return st, err
	}
	st.backwardTime = time.Since(began)

	// The gradients are complete here: every agent's share of the mini-batch loss is in, each passed
	// by the guard (in backward). Whatever must see the whole gradient before the norm, the skip and
	// the step goes here.
	if st.gradNorm, err = ms.par.norm(ms.id, kept); err != nil { // pre-clip (sharded: from the ranks' partitions)
		return st, err
	}
	anyKept, finite := st.sharesKept()
	if !finite { // the guard left out every share, each for being non-finite: a non-finite step
		st.gradNorm = math.NaN()
	}
	if !isFinite(st.gradNorm) {
		ZeroGrad(ms.params)
		st.skipped = true
		ms.streak++
		log.Warn().Str("model", ms.id).Int("iteration", it).Int("in_a_row", ms.streak).Msg("non-finite gradient norm: step skipped")
		if ms.streak >= ms.upd.maxNonfinite {
			return st, fmt.Errorf("model %s: %d optimizer steps in a row had a non-finite gradient norm (algorithm.max_nonfinite_steps): aborting", ms.id, ms.streak)
		}
		return st, nil
	}
	ms.streak = 0
	if !anyKept { // the guard left every share out: no step
		ZeroGrad(ms.params)
		st.guarded = true
		return st, nil
	}
	// AdamW (sharded: each rank its partition, then the weights are shared)
	return st, clippedStep(ms.params, st.gradNorm, ms.upd.gradClip, func() error { return ms.par.step(ms.id, ms.opt, ms.params) })
}

// backward adds the gradient of the mini-batch loss into the parameters' gradients, agent by agent
// in name order, and measures each agent's share. The agents' shares of the loss add up to the
// mini-batch loss, so their gradients add up to its gradient: an agent's gradient norm is the norm
// of what its share added (with one agent, the whole gradient's norm). This rank runs its own calls;
// the strategy's collectives make the gradient global, in one of two ways:
//
//	exact shares  each agent's share is computed alone from zero, summed over the ranks, measured and
//	              judged by the guard (every rank sees the same sum, so takes the same verdict), and
//	              added to the total of the shares before it, which becomes the gradient of kept
//	local shares  the shares accumulate in the gradients, each measured as the difference from a
//	              snapshot taken before it; then one all-reduce completes the whole (completeLocal)
//
// kept are the parameters whose gradients this rank keeps (all of them unless dist.shard:
// gradients). Torch thread.
func (ms *modelState) backward(mb miniBatch, kept []*ts.Tensor) (stepStats, error) {
	var st stepStats
	torch.DefineGrads(ms.params) // an agent whose calls all carry no signal runs no backward
	agents, byAgent := groupByAgent(mb.items)
	exact := ms.par.exactShares() && (len(agents) > 1 || ms.guard != nil)
	// exact: the judged shares summed so far (of kept); local: the gradient before the current
	// agent's share (nil = zero).
	var acc []*ts.Tensor
	defer func() { dropAll(acc) }()
	for i, agent := range agents {
		share := agentShare{agent: agent}
		if exact {
			ZeroGrad(ms.params)
		}
		if err := ms.agentBackward(localItems(byAgent[agent]), ms.loss.agents[agent], mb, &share, &st); err != nil {
			return st, err
		}
		if exact {
			err := ms.par.reduce(ms.id, ms.params)
			if err == nil {
				share.gradNorm, err = ms.par.norm(ms.id, kept)
			}
			if err != nil {
				return st, err
			}
			ms.judge(&share, kept, nil)
			if acc == nil {
				acc = snapshotGrads(kept)
			} else {
				addGrads(acc, kept)
			}
		} else {
			share.gradNorm = gradDiffNorm(ms.params, acc)
			ms.judge(&share, ms.params, acc)
			if i < len(agents)-1 {
				dropAll(acc)
				acc = snapshotGrads(ms.params)
			}
		}
		st.agents = append(st.agents, share)
	}
	if exact {
		if acc != nil {
			setGrads(kept, acc)
		}
		return st, nil
	}
	return st, ms.completeLocal(&st, kept)
}

// completeLocal makes the gradient of local shares global: summed over the ranks. One agent's norm
// is then the complete gradient's; several agents' norms become the root of the summed squares of
// the ranks' own shares (dist.agent_norms: approx).
func (ms *modelState) completeLocal(st *stepStats, kept []*ts.Tensor) error {
	if err := ms.par.reduce(ms.id, ms.params); err != nil || ms.par.group().Size() == 1 {
		return err
	}
	switch len(st.agents) {
	case 0:
	case 1:
		n, err := ms.par.norm(ms.id, kept)
		if err != nil {
			return err
		}
		st.agents[0].gradNorm = n
	default:
		sq := make([]float64, len(st.agents))
		for i, a := range st.agents {
			sq[i] = a.gradNorm * a.gradNorm
		}
		if err := ms.par.sum(sq); err != nil {
			return err
		}
		for i := range st.agents {
			st.agents[i].gradNorm = math.Sqrt(sq[i])
		}
	}
	return nil
}

// agentBackward runs one agent's calls of the mini-batch through microBatchLoss, micro-batch by
// micro-batch (c.microBatch calls each, or packed by the model's token budget), adding their loss terms and token counts to the agent's share and to the step's.
func (ms *modelState) agentBackward(xs []*item, c agentCoefs, mb miniBatch, share *agentShare, st *stepStats) error {
	if c.entropy == 0 && (c.kl == 0 || ms.ref == nil) { // no term but the pg loss: zero advantages add nothing
		var idle tokenCounts
		xs, idle = withSignal(xs)
		st.tokens.add(idle)
	}
	for _, part := range ms.loss.microBatches(xs, c.microBatch) {
		loss, tok, err := ms.microBatchLoss(part, c, mb)
		if err != nil {
			return err
		}
		share.loss.add(loss)
		share.tokens.add(tok)
		st.loss.add(loss)
		st.tokens.add(tok)
	}
	return nil
}

// withSignal leaves out the calls whose advantage is zero, counting them and their response tokens:
// with no KL or entropy term their loss is 0·ratio, so their gradient is zero and the backward
// without them is the same (the mini-batch's denominators already count them). Their tokens are then
// not in the clip fractions and ppo_kl, which are over the tokens trained.
func withSignal(xs []*item) ([]*item, tokenCounts) {
	var idle tokenCounts
	kept := xs[:0:0]
	for _, x := range xs {
		if x.adv == 0 {
			idle.IdleCalls++
			idle.IdleTokens += float64(len(x.response))
			continue
		}
		kept = append(kept, x)
	}
	return kept, idle
}

// judge lets the guard, when it is on, clip or drop the agent's share of the gradient of params:
// what it added since before (nil = since zero), measured as share.gradNorm. Torch thread.
func (ms *modelState) judge(share *agentShare, params, before []*ts.Tensor) {
	if ms.guard != nil {
		share.verdict = ms.guard.judge(share.agent, share.gradNorm)
		applyVerdict(params, before, share.verdict, ms.id, share.agent, share.gradNorm)
	}
}

// microBatchLoss runs forward and backward on one micro-batch of one agent's calls, adding its share
// of the mini-batch loss to the gradients:
//
//	loss = pg − entropy·H + kl·KL(π ‖ π_ref)   each term aggregated by loss_agg_mode over mb.denom
//
// It returns the micro-batch's loss terms and token counts.
func (ms *modelState) microBatchLoss(xs []*item, c agentCoefs, mb miniBatch) (lossTerms, tokenCounts, error) {
	var lt lossTerms
	var tc tokenCounts
	s := torch.NewScope()
	defer s.Close()
	// The entropy is measured whatever its coefficient (as verl logs it); in the loss only with one.
	sc, bp, err := ms.pol.Model.TrainScore(ms.moe.sequences(xs), true, ms.upd.checkpointing)
	if err != nil {
		return lt, tc, err
	}
	dev := ms.pol.Model.Device()
	width := int(sc.LogProbs.MustSize()[1])
	logp := sc.LogProbs // the loss in float32, or float64 for a float64 model
	if dt := logp.DType(); dt != gotch.Float && dt != gotch.Double {
		logp = logp.MustTotype(gotch.Float, false)
	}
	mask := sc.Mask.MustTotype(gotch.Float, false)
	var old *ts.Tensor
	if mb.onPolicy {
		old = logp.MustDetach(false)
	} else {
		old = padded(xs, width, func(x *item) []float32 { return x.old }, dev)
	}
	advs := make([]float32, len(xs))
	for i, x := range xs {
		advs[i] = float32(x.adv)
	}
	adv := ts.MustOfSlice(advs).MustTo(dev, true)

	pgMat, clipped, lower, negLR := PGLoss(logp, old, adv, c.clipLow, c.clipHigh, ms.loss.clipC)
	if ms.correcting() && c.behaviourKnown { // off-policy correction (correction.go)
		if pgMat, lt.corr, err = ms.correct(pgMat, old, mask, xs, width); err != nil {
			return lt, tc, err
		}
	}
	if ms.loss.balance { // each call's pg loss weighted (Dr. MAS reference: pg loss only, before aggregation)
		pgMat = pgMat.MustMul(rowWeights(xs, dev), false)
	}
	pg, err := Aggregate(pgMat, mask, ms.loss.aggMode, mb.denom)
	if err != nil {
		return lt, tc, err
	}
	loss := pg
	ent, err := Aggregate(sc.Entropy.MustTotype(logp.DType(), false), mask, ms.loss.aggMode, mb.denom)
	if err != nil {
		return lt, tc, err
	}
	if c.entropy > 0 {
		loss = loss.MustSub(ent.MustMulScalar(ts.FloatScalar(c.entropy), false), false)
	}
	lt.Entropy = ent.Float64Values()[0]
	tc.EntropySum = MaskedSum(sc.Entropy.MustTotype(logp.DType(), false), mask)
	if c.kl > 0 && ms.ref != nil {
		ref := padded(xs, width, func(x *item) []float32 { return x.ref }, dev)
		klMat, err := KLPenalty(logp, ref, ms.loss.klType)
		if err != nil {
			return lt, tc, err
		}
		kl, err := Aggregate(klMat, mask, ms.loss.aggMode, mb.denom)
		if err != nil {
			return lt, tc, err
		}
		loss = loss.MustAdd(kl.MustMulScalar(ts.FloatScalar(c.kl), false), false)
		lt.KL = kl.Float64Values()[0]
		tc.KLSum = MaskedSum(klMat, mask)
	}
	loss, lt.routes = ms.moe.account(sc, loss, float64(len(xs))/max(mb.denom.Seqs, 1))
	bp.Backward(loss)

	lt.PG = pg.Float64Values()[0]
	tc.Tokens, tc.Clipped = MaskedSum(mask, mask), MaskedSum(clipped, mask)
	tc.ClippedLow, tc.NegLogRatio = MaskedSum(lower, mask), MaskedSum(negLR, mask)
	return lt, tc, nil
}

// missing says whether some item lacks the log-probs get returns (kl_in_reward records the old and
// the reference ones before the update, for all of a model's items or none).
func missing(items []*item, get func(*item) []float32) bool {
	for _, x := range items {
		if get(x) == nil {
			return true
		}
	}
	return false
}

// groupByAgent splits items by agent; the agents come sorted.
func groupByAgent(items []*item) ([]string, map[string][]*item) {
	byAgent := map[string][]*item{}
	for _, x := range items {
		byAgent[x.agent] = append(byAgent[x.agent], x)
	}
	agents := make([]string, 0, len(byAgent))
	for a := range byAgent {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	return agents, byAgent
}

// byAgent groups the iteration's advantages by agent (for the reporter's histograms).
func byAgent(samples []env.Sample, adv []float64) map[string][]float64 {
	out := map[string][]float64{}
	for i, s := range samples {
		if i < len(adv) {
			out[s.Agent] = append(out[s.Agent], adv[i])
		}
	}
	return out
}
