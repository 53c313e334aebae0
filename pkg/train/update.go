package train

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// stepStats accumulates one model's loss statistics over an iteration's optimizer steps.
type stepStats struct {
	steps, skipped                  int
	pgLoss, klLoss, entLoss         float64 // sums over steps of the aggregated loss terms
	tokens, clipped, clippedLow, kl float64 // token sums for the fractions and ppo_kl
	modelNorms                      []float64
	agentNorms                      map[string][]float64
}

// update trains one model group on its agents' calls of this iteration: ppo_epochs passes, each split
// into ppo_mini_update_num optimizer steps. Runs on the torch thread.
func (t *Trainer) update(ms *modelState, items []*item, it int, m Metrics) error {
	al := t.cfg.Algorithm
	st := &stepStats{agentNorms: map[string][]float64{}}
	if len(items) > 0 {
		// With one update per iteration the old policy is the current one: its log-probs are the
		// detached log-probs of the same forward pass (verl recomputes them; the values are equal).
		single := al.PPOEpochs == 1 && al.PPOMiniUpdateNum == 1
		if !single {
			if err := t.fill(ms.pol, items, false); err != nil {
				return err
			}
		}
		if ms.ref != nil {
			if err := t.fill(ms.ref, items, true); err != nil {
				return err
			}
		}
		for epoch := 0; epoch < al.PPOEpochs; epoch++ {
			order := rand.New(rand.NewPCG(uint64(t.cfg.Run.Seed)^hashString(ms.id), uint64(it*1000+epoch))).Perm(len(items))
			n := al.PPOMiniUpdateNum
			for k := 0; k < n; k++ {
				lo, hi := k*len(order)/n, (k+1)*len(order)/n
				if hi == lo {
					continue
				}
				chunk := make([]*item, 0, hi-lo)
				for _, i := range order[lo:hi] {
					chunk = append(chunk, items[i])
				}
				if err := t.optimizerStep(ms, chunk, single, it, st); err != nil {
					return err
				}
			}
		}
	}
	t.modelMetrics(ms, st, m)
	return nil
}

// fill computes per-token log-probs without grad: the old policy's (ref=false) or the reference's.
func (t *Trainer) fill(pol *policy.Policy, items []*item, ref bool) error {
	mb := t.cfg.Algorithm.MicroBatchSize
	return torch.NoGrad(func() error {
		for lo := 0; lo < len(items); lo += mb {
			hi := min(lo+mb, len(items))
			s := torch.NewScope()
			sc, err := pol.Score(seqs(items[lo:hi]), false)
			if err != nil {
				s.Close()
				return err
			}
			lp := sc.LogProbs.MustTotype(gotch.Float, false).MustTo(gotch.CPU, true).MustContiguous(true)
			rows := make([]float32, lp.Numel())
			lp.MustCopyData(rows, lp.Numel())
			width := int(sc.LogProbs.MustSize()[1])
			for i, x := range items[lo:hi] {
				v := append([]float32(nil), rows[i*width:i*width+len(x.response)]...)
				if ref {
					x.ref = v
				} else {
					x.old = v
				}
			}
			s.Close()
		}
		return nil
	})
}

func seqs(items []*item) []policy.Sequence {
	out := make([]policy.Sequence, len(items))
	for i, x := range items {
		out[i] = policy.Sequence{PromptIDs: x.prompt, ResponseIDs: x.response}
	}
	return out
}

// padded returns a [len(items), width] float32 tensor of per-token values (zero-padded).
func padded(items []*item, width int, get func(*item) []float32, dev gotch.Device) *ts.Tensor {
	flat := make([]float32, len(items)*width)
	for i, x := range items {
		copy(flat[i*width:], get(x))
	}
	return ts.MustOfSlice(flat).MustView([]int64{int64(len(items)), int64(width)}, true).MustTo(dev, true)
}

// optimizerStep accumulates the gradient of one mini-batch agent by agent (measuring each agent's
// share), then clips and steps. A non-finite total norm skips the step and zeroes the gradients.
func (t *Trainer) optimizerStep(ms *modelState, chunk []*item, single bool, it int, st *stepStats) error {
	al := t.cfg.Algorithm
	d := Denominators{Seqs: float64(len(chunk)), Horizon: ms.horizon}
	for _, x := range chunk {
		d.Tokens += float64(len(x.response))
	}
	ZeroGrad(ms.params)
	agentNorms, losses, err := t.accumulate(ms, chunk, d, single, st)
	if err != nil {
		return err
	}
	if t.injectNonfinite != nil && t.injectNonfinite(ms.id, it) {
		poisonGrad(ms.params[0])
	}
	norm := GradNorm(ms.params)
	for a, n := range agentNorms {
		if len(agentNorms) == 1 {
			n = norm // one agent: its share is the whole gradient
		}
		st.agentNorms[a] = append(st.agentNorms[a], n)
	}
	st.modelNorms = append(st.modelNorms, norm)
	st.steps++
	st.pgLoss, st.klLoss, st.entLoss = st.pgLoss+losses[0], st.klLoss+losses[1], st.entLoss+losses[2]
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		ZeroGrad(ms.params)
		st.skipped++
		ms.streak++
		log.Warn().Str("model", ms.id).Int("iteration", it).Int("in_a_row", ms.streak).Msg("non-finite gradient norm: step skipped")
		if ms.streak >= al.MaxNonfiniteSteps {
			return fmt.Errorf("model %s: %d optimizer steps in a row had a non-finite gradient norm (algorithm.max_nonfinite_steps): aborting", ms.id, ms.streak)
		}
		return nil
	}
	ms.streak = 0
	if clip := ms.cfg.Optim.GradClip; clip > 0 && norm > clip {
		ScaleGrads(ms.params, clip/(norm+1e-6))
	}
	ms.opt.Apply(ms.opt.CurrentLR())
	return nil
}

// accumulate runs forward and backward over the items, agent by agent in name order, adding into the
// parameters' gradients. With several agents it measures each agent's own gradient norm: the norm of
// what its share of the loss added (the shares add up to the model's loss, so their gradients add up
// to the model's gradient). It returns those norms and the summed pg, KL and entropy loss terms.
func (t *Trainer) accumulate(ms *modelState, items []*item, d Denominators, single bool, st *stepStats) (map[string]float64, [3]float64, error) {
	var losses [3]float64
	byAgent := map[string][]*item{}
	for _, x := range items {
		byAgent[x.agent] = append(byAgent[x.agent], x)
	}
	agents := make([]string, 0, len(byAgent))
	for a := range byAgent {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	norms := map[string]float64{}
	var prev []*ts.Tensor // the gradient before the current agent's share
	defer func() { dropAll(prev) }()
	for ai, agent := range agents {
		c := t.coefs(agent)
		xs := byAgent[agent]
		for lo := 0; lo < len(xs); lo += c.microBatch {
			p, k, e, err := t.microStep(ms, xs[lo:min(lo+c.microBatch, len(xs))], c, d, single, st)
			if err != nil {
				return nil, losses, err
			}
			losses[0], losses[1], losses[2] = losses[0]+p, losses[1]+k, losses[2]+e
		}
		if len(agents) == 1 {
			norms[agent] = math.NaN() // filled in by the caller with the model's norm
			break
		}
		norms[agent] = gradDiffNorm(ms.params, prev)
		if ai < len(agents)-1 {
			dropAll(prev)
			prev = snapshotGrads(ms.params)
		}
	}
	return norms, losses, nil
}

// microStep runs forward and backward on one micro-batch of one agent's calls and returns its
// shares of the pg, KL and entropy losses.
func (t *Trainer) microStep(ms *modelState, mb []*item, c agentCoefs, d Denominators, single bool, st *stepStats) (pg, kl, ent float64, err error) {
	al := t.cfg.Algorithm
	s := torch.NewScope()
	defer s.Close()
	sc, err := ms.pol.Score(seqs(mb), c.entropy > 0)
	if err != nil {
		return 0, 0, 0, err
	}
	dev := ms.pol.Model.Device()
	width := int(sc.LogProbs.MustSize()[1])
	logp := sc.LogProbs
	if logp.DType() != gotch.Float {
		logp = logp.MustTotype(gotch.Float, false)
	}
	mask := sc.Mask.MustTotype(gotch.Float, false)
	var old *ts.Tensor
	if single {
		old = logp.MustDetach(false)
	} else {
		old = padded(mb, width, func(x *item) []float32 { return x.old }, dev)
	}
	advs := make([]float32, len(mb))
	for i, x := range mb {
		advs[i] = float32(x.adv)
	}
	adv := ts.MustOfSlice(advs).MustTo(dev, true)
	pgMat, clipped, lower, negLR := PGLoss(logp, old, adv, c.clipLow, c.clipHigh, al.ClipRatioC)
	pgAgg, err := Aggregate(pgMat, mask, al.LossAggMode, d)
	if err != nil {
		return 0, 0, 0, err
	}
	loss := pgAgg
	if c.entropy > 0 {
		entAgg, err := Aggregate(sc.Entropy.MustTotype(gotch.Float, false), mask, al.LossAggMode, d)
		if err != nil {
			return 0, 0, 0, err
		}
		loss = loss.MustSub(entAgg.MustMulScalar(ts.FloatScalar(c.entropy), false), false)
		ent = entAgg.Float64Values()[0]
	}
	if c.kl > 0 && ms.ref != nil {
		ref := padded(mb, width, func(x *item) []float32 { return x.ref }, dev)
		klMat, err := KLPenalty(logp, ref, al.KL.Type)
		if err != nil {
			return 0, 0, 0, err
		}
		klAgg, err := Aggregate(klMat, mask, al.LossAggMode, d)
		if err != nil {
			return 0, 0, 0, err
		}
		loss = loss.MustAdd(klAgg.MustMulScalar(ts.FloatScalar(c.kl), false), false)
		kl = klAgg.Float64Values()[0]
	}
	loss.MustBackward()
	st.tokens += MaskedSum(mask, mask)
	st.clipped += MaskedSum(clipped, mask)
	st.clippedLow += MaskedSum(lower, mask)
	st.kl += MaskedSum(negLR, mask)
	return pgAgg.Float64Values()[0], kl, ent, nil
}

// snapshotGrads copies the current gradients (freed by dropAll).
func snapshotGrads(params []*ts.Tensor) []*ts.Tensor {
	out := make([]*ts.Tensor, len(params))
	_ = torch.Untracked(func() error {
		return torch.NoGrad(func() error {
			for i, p := range params {
				g := p.MustGrad(false)
				out[i] = g.MustDetachCopy(false)
				g.MustDrop()
			}
			return nil
		})
	})
	return out
}

func dropAll(ts []*ts.Tensor) {
	for _, t := range ts {
		if t != nil {
			t.MustDrop()
		}
	}
}

// gradDiffNorm is the L2 norm of (current gradient − prev), prev nil meaning zero: the gradient norm
// of the share of the loss accumulated since prev was taken.
func gradDiffNorm(params []*ts.Tensor, prev []*ts.Tensor) float64 {
	if prev == nil {
		return GradNorm(params)
	}
	s := torch.NewScope()
	defer s.Close()
	total := 0.0
	_ = torch.NoGrad(func() error {
		var acc *ts.Tensor
		for i, p := range params {
			g := p.MustGrad(false)
			if !g.MustDefined() {
				continue
			}
			sq := g.MustSub(prev[i], false).MustTotype(gotch.Float, true).MustSquare(true).MustSum(gotch.Double, true)
			if acc == nil {
				acc = sq
			} else {
				acc = acc.MustAdd(sq, false)
			}
		}
		if acc != nil {
			total = acc.Float64Values()[0]
		}
		return nil
	})
	return math.Sqrt(total)
}

// poisonGrad puts a NaN into a parameter's gradient (tests of the non-finite path).
func poisonGrad(p *ts.Tensor) {
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		g := p.MustGrad(false)
		g.MustFill_(ts.FloatScalar(math.NaN()))
		return nil
	})
}

// modelMetrics writes one model's figures for the iteration.
func (t *Trainer) modelMetrics(ms *modelState, st *stepStats, m Metrics) {
	suffix := ""
	if len(t.models) > 1 {
		suffix = "/" + ms.id
	}
	m["nonfinite/model/"+ms.id] = float64(st.skipped)
	if len(st.modelNorms) > 0 { // a model none of whose agents was called this iteration has no norm
		m["grad_norm/model/"+ms.id] = maxOf(st.modelNorms)
		m["grad_norm_mean/model/"+ms.id] = meanOf(st.modelNorms)
	}
	m["lr/model/"+ms.id] = ms.opt.CurrentLR()
	for a, ns := range st.agentNorms {
		m["grad_norm/agent/"+a] = maxOf(ns)
		m["grad_norm_mean/agent/"+a] = meanOf(ns)
	}
	if st.steps == 0 {
		return
	}
	n := float64(st.steps)
	m["loss/pg"+suffix] = st.pgLoss / n
	m["loss/kl"+suffix] = st.klLoss / n
	m["loss/entropy"+suffix] = st.entLoss / n
	tok := math.Max(st.tokens, 1)
	m["pg_clipfrac"+suffix] = st.clipped / tok
	m["pg_clipfrac_lower"+suffix] = st.clippedLow / tok
	m["ppo_kl"+suffix] = st.kl / tok
}

// maxOf is the max over finite-or-not values: NaN if any value is NaN (a skipped step stays visible).
func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	out := xs[0]
	for _, x := range xs[1:] {
		if math.IsNaN(x) || x > out {
			out = x
		}
		if math.IsNaN(out) {
			return out
		}
	}
	return out
}

func meanOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
