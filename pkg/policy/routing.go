package policy

// Routing record and replay for mixture-of-experts models (routing replay, R3): a forward call —
// a score or training pass, a generation's prefill or decoding step — can record the experts each
// token was routed to, compare its own routing with routes it is given, and replay them: route
// those tokens to the given experts, with the gate weights recomputed from its own router's
// probabilities, so that the log-probs are those of the routing that sampled the tokens while the
// router still gets a gradient. It also gathers what the router's load-balancing loss needs
// (TrainScore). Dense models never build any of it.

import (
	"errors"
	"fmt"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/torch"
)

// Routes are the experts a mixture-of-experts model routed consecutive tokens to (llm.Routes: the
// seam carries them with a completion).
type Routes = llm.Routes

// RouteStats compare a pass's routing with the routes it was given, per decoder layer (zeros in
// dense layers): the inputs of a routing-mismatch metric.
type RouteStats struct {
	// Tokens counts the tokens that had routes given.
	Tokens []int64
	// Live counts those whose live top-k (the experts the pass's own router picks, as a set)
	// differs from the given ones: how far the router has moved since they were recorded.
	Live []int64
	// Used counts those whose experts the pass used differ from the given ones: 0 for replayed
	// tokens, Live's count for tokens only compared.
	Used []int64
}

// Add adds o's counts to s's (s's slices are made when empty).
func (s *RouteStats) Add(o *RouteStats) {
	if o == nil {
		return
	}
	if s.Tokens == nil {
		s.Tokens, s.Live, s.Used = make([]int64, len(o.Tokens)), make([]int64, len(o.Tokens)), make([]int64, len(o.Tokens))
	}
	for l := range o.Tokens {
		s.Tokens[l] += o.Tokens[l]
		s.Live[l] += o.Live[l]
		s.Used[l] += o.Used[l]
	}
}

// isMoE says whether m has a mixture-of-experts layer.
func (m *Model) isMoE() bool { return m.opts.MoE.SparseLayers() > 0 }

// checkRoutes refuses routes that are not m's (layers, top-k) or that cover tokens past a sequence
// of n tokens, and expert ids of a sparse layer outside the experts or repeated within a token.
func (m *Model) checkRoutes(r *Routes, n int) error {
	moe := m.opts.MoE
	switch {
	case !m.isMoE():
		return errors.New("routes given for a model without mixture-of-experts layers")
	case r.Layers != len(m.Layers) || int64(r.TopK) != moe.TopK:
		return fmt.Errorf("routes of %d layers × top-%d, the model has %d layers × top-%d", r.Layers, r.TopK, len(m.Layers), moe.TopK)
	case len(r.IDs)%(r.Layers*r.TopK) != 0:
		return fmt.Errorf("routes: %d ids, not a whole number of tokens of %d layers × top-%d", len(r.IDs), r.Layers, r.TopK)
	case r.From < 0 || r.From+r.Tokens() > n:
		return fmt.Errorf("routes of tokens %d – %d, the sequence has %d", r.From, r.From+r.Tokens()-1, n)
	}
	for t := range r.Tokens() {
		for l := range r.Layers {
			if !moe.SparseLayer(l) {
				continue
			}
			ids := r.IDs[(t*r.Layers+l)*r.TopK:][:r.TopK]
			for i, e := range ids {
				if int64(e) < 0 || int64(e) >= moe.Experts {
					return fmt.Errorf("routes: token %d, layer %d: expert %d outside 0 – %d", r.From+t, l, e, moe.Experts-1)
				}
				for _, f := range ids[:i] {
					if f == e {
						return fmt.Errorf("routes: token %d, layer %d: expert %d twice", r.From+t, l, e)
					}
				}
			}
		}
	}
	return nil
}

// routeToken is what routing needs to know of one token of a forward call.
type routeToken struct {
	given  *Routes // the routes of its sequence (nil: none), which may not cover it
	at     int     // its index in its sequence
	replay bool    // route it to the given experts (else only compare)
	real   bool    // a token of a sequence, not padding (the load-balancing loss counts it)
}

// routing is a forward call's routing work, shared by its sparse layers through the pass. Its
// tensors are made before the layers run, in the caller's scope, and the layers write into them in
// place (each layer runs in a scope of its own, see step).
type routing struct {
	layers  int
	topK    int64
	experts int64
	given   *ts.Tensor // [N, layers, k] int64: the given experts (−1: none given for the token); nil: none at all
	has     *ts.Tensor // [N] bool: the tokens with given experts
	rep     *ts.Tensor // [N, 1] bool: the tokens routed to them; nil: none
	counts  *ts.Tensor // [layers, 3] int64: RouteStats' Tokens, Live, Used
	// used [N, layers, k] int64 receives the experts each token used (−1 in dense layers); nil:
	// not kept. force routes every token to them instead (a checkpointed layer recomputed).
	used  *ts.Tensor
	force bool
	// The load-balancing loss: real [N] (compute dtype, 1 on real tokens; nil: not wanted); per
	// layer, the real tokens' count of picks of each expert (auxC) and sum of probabilities
	// (auxS), [layers, experts]; auxG, each layer's sum with its graph (training).
	real       *ts.Tensor
	auxC, auxS *ts.Tensor
	auxG       []*ts.Tensor
}

// newRouting prepares the routing of a forward call of m over toks (the call's tokens, row-major),
// keeping the experts each token used when keep is set and the load-balancing loss's sums when aux
// is. nil for a dense model, or when there is nothing to do but route live.
func (m *Model) newRouting(toks []routeToken, keep, aux bool) *routing {
	if !m.isMoE() {
		return nil
	}
	moe := m.opts.MoE
	r := &routing{layers: len(m.Layers), topK: moe.TopK, experts: moe.Experts}
	N, L, K := int64(len(toks)), int64(r.layers), moe.TopK
	var given []int64
	has, rep := make([]bool, N), make([]bool, N)
	anyRep := false
	for n, t := range toks {
		if t.given == nil || t.at < t.given.From || t.at >= t.given.From+t.given.Tokens() {
			continue
		}
		if given == nil {
			given = make([]int64, N*L*K)
			for i := range given {
				given[i] = -1
			}
		}
		src := t.given.IDs[(t.at-t.given.From)*r.layers*int(K):][:r.layers*int(K)]
		for i, e := range src {
			given[int64(n)*L*K+int64(i)] = int64(e)
		}
		has[n], rep[n] = true, t.replay
		anyRep = anyRep || t.replay
	}
	if given == nil && !keep && !aux {
		return nil
	}
	dev := m.device
	if given != nil {
		r.given = ts.MustOfSlice(given).MustTo(dev, true).MustView([]int64{N, L, K}, true)
		r.has = ts.MustOfSlice(has).MustTo(dev, true)
		if anyRep {
			r.rep = ts.MustOfSlice(rep).MustTo(dev, true).MustView([]int64{N, 1}, true)
		}
		r.counts = ts.MustZeros([]int64{L, 3}, gotch.Int64, dev)
	}
	if keep {
		r.used = ts.MustFull([]int64{N, L, K}, ts.IntScalar(-1), gotch.Int64, dev)
	}
	if aux {
		real := make([]float64, N)
		for n, t := range toks {
			if t.real {
				real[n] = 1
			}
		}
		r.real = ts.MustOfSlice(real).MustTotype(m.compute, true).MustTo(dev, true)
		r.auxC = ts.MustZeros([]int64{L, r.experts}, m.compute, dev)
		r.auxS = ts.MustZeros([]int64{L, r.experts}, m.compute, dev)
		r.auxG = make([]*ts.Tensor, r.layers)
	}
	return r
}

// apply takes layer's live top-k (idx, and its probabilities top, of the router's probs [N,
// experts]) and returns the experts the tokens use and their weights: the given ones where they are
// replayed (weights gathered from probs), else the live ones. It counts the differences with the
// given experts and keeps the experts used.
func (r *routing) apply(layer int, probs, live, top *ts.Tensor) (idx, w *ts.Tensor) {
	idx, w = live, top
	if r.given != nil {
		g := r.given.MustSelect(1, int64(layer), false) // [N, k]
		if r.rep != nil {
			idx = g.MustWhereSelf(r.rep, live, false)
			w = probs.MustGather(1, idx, false, false)
		}
		want, _ := g.MustSort(-1, false, false)
		differ := func(x *ts.Tensor) *ts.Tensor {
			s, _ := x.MustSort(-1, false, false)
			return s.MustNeTensor(want, true).MustAnyDim(1, false, true).MustLogicalAnd(r.has, true).MustSum(gotch.Int64, true)
		}
		liveDiff := differ(live)
		usedDiff := liveDiff
		if r.rep != nil {
			usedDiff = differ(idx)
		}
		row := ts.MustStack([]*ts.Tensor{r.has.MustSum(gotch.Int64, false), liveDiff, usedDiff}, 0)
		r.counts.MustSelect(0, int64(layer), false).MustAdd_(row)
	}
	if r.used != nil {
		r.used.MustSelect(1, int64(layer), false).Copy_(idx)
	}
	return idx, w
}

// usedAt is the experts the tokens used in layer (force), [N, k].
func (r *routing) usedAt(layer int) *ts.Tensor { return r.used.MustSelect(1, int64(layer), false) }

// aux gathers layer's part of the load-balancing loss from the router's probs [N, experts] and
// live top-k picks [N, k] (transformers' load_balancing_loss_func counts the router's own picks):
// the real tokens' sum of probabilities (with its graph when it has one, for Backprop) and, but in a
// recomputation, their count of picks of each expert.
func (r *routing) aux(layer int, probs, live *ts.Tensor) {
	real := r.real.MustUnsqueeze(1, false)
	s := probs.MustMul(real, false).MustSumDimIntlist([]int64{0}, false, gotch.Invalid, true)
	if s.MustRequiresGrad() {
		r.auxG[layer] = s
	}
	if r.force {
		return
	}
	r.auxS.MustSelect(0, int64(layer), false).Copy_(s.MustDetach(false))
	picks := real.MustExpand(live.MustSize(), false, false).MustReshape([]int64{-1}, true)
	c := ts.MustZeros([]int64{r.experts}, probs.DType(), probs.MustDevice()).MustIndexAdd(0, live.MustReshape([]int64{-1}, false), picks, true)
	r.auxC.MustSelect(0, int64(layer), false).MustAdd_(c)
}

// takeAux hands over layer's sum of probabilities with its graph (nil when there is none).
func (r *routing) takeAux(layer int) *ts.Tensor {
	if r == nil || r.auxG == nil {
		return nil
	}
	s := r.auxG[layer]
	r.auxG[layer] = nil
	return s
}

// auxLoss is the load-balancing loss of the call (transformers' load_balancing_loss_func with
// the real tokens as its attention mask), E·Σₑ fₑ·Pₑ over the sparse layers' tokens, fₑ the share of
// picks of expert e and Pₑ its mean probability; and ∂loss/∂S, the loss's gradient with respect to
// each layer's sum of probabilities (the same for every layer), [experts].
func (r *routing) auxLoss(sparse int) (loss, grad *ts.Tensor) {
	n := r.real.MustSum(gotch.Invalid, false).MustMulScalar(ts.FloatScalar(float64(sparse)), true) // tokens over the layers
	norm := n.MustSquare(true).MustReciprocal(true).MustMulScalar(ts.FloatScalar(float64(r.experts)), true)
	picks := r.auxC.MustSumDimIntlist([]int64{0}, false, gotch.Invalid, false)
	probs := r.auxS.MustSumDimIntlist([]int64{0}, false, gotch.Invalid, false)
	grad = picks.MustMul(norm, true)
	loss = grad.MustMul(probs, false).MustSum(gotch.Invalid, true)
	return loss, grad
}

// stats reads the counts of the call (nil when no routes were given).
func (r *routing) stats() *RouteStats {
	if r == nil || r.counts == nil {
		return nil
	}
	v := r.counts.Int64Values()
	s := &RouteStats{Tokens: make([]int64, r.layers), Live: make([]int64, r.layers), Used: make([]int64, r.layers)}
	for l := range r.layers {
		s.Tokens[l], s.Live[l], s.Used[l] = v[3*l], v[3*l+1], v[3*l+2]
	}
	return s
}

// usedValues copies the experts each token used to the host ([N × layers × k]; nil when not kept).
func (r *routing) usedValues() []int64 {
	if r == nil || r.used == nil {
		return nil
	}
	var v []int64
	_ = torch.NoGrad(func() error {
		v = r.used.Int64Values()
		return nil
	})
	return v
}

// routesOf is the Routes of tokens [from, from+n) of a sequence whose token from is entry first of
// used ([N × layers × k], consecutive entries for consecutive tokens).
func (r *routing) routesOf(used []int64, first, from, n int) Routes {
	w := r.layers * int(r.topK)
	ids := make([]int16, n*w)
	for i, e := range used[first*w : (first+n)*w] {
		ids[i] = int16(e)
	}
	return Routes{From: from, Layers: r.layers, TopK: int(r.topK), IDs: ids}
}

// RouteShape is what the model routes each token to (the zero shape for a dense model): what an
// engine's routed experts are read as.
func (m *Model) RouteShape() llm.RouteShape {
	if !m.isMoE() {
		return llm.RouteShape{}
	}
	return llm.RouteShape{Layers: len(m.Layers), TopK: int(m.opts.MoE.TopK)}
}
