package train

import (
	"fmt"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/sugarme/gotch/ts"
)

// routing is a mixture-of-experts model's routing in training (nil for a dense model): whether its
// passes over the sampled calls route their tokens to the experts the generator used
// (algorithm.routing_replay: rollout, R3) or to their live router's top-k (none), and the weight of
// the router's load-balancing loss in the model's loss. The gate weights are the live router's
// either way, so the router learns.
type routing struct {
	replay  bool
	auxCoef float64 // router_aux_loss_coef when output_router_logits (transformers' rule), else 0
	layers  []int   // the sparse layers' indices
	depth   int     // num_hidden_layers
}

func newRouting(m *policy.Model, mode string) *routing {
	moe := arch.OptionsOf(m.Config).MoE
	if moe.SparseLayers() == 0 {
		return nil
	}
	r := &routing{replay: mode == algo.ReplayRollout, depth: m.Config.NumHiddenLayers}
	if moe.OutputRouterLogits {
		r.auxCoef = moe.AuxLossCoef
	}
	for l := range moe.Sparse {
		if moe.SparseLayer(l) {
			r.layers = append(r.layers, l)
		}
	}
	return r
}

// sequences are the items as the model's passes take them: with the experts the generator routed
// their tokens to, replayed or only compared (a dense model's: the tokens alone).
func (r *routing) sequences(xs []*item) []policy.Sequence {
	out := make([]policy.Sequence, len(xs))
	for i, x := range xs {
		out[i] = policy.Sequence{PromptIDs: x.prompt, ResponseIDs: x.response}
		if r != nil {
			out[i].Routes, out[i].Replay = x.routes, r.replay && x.routes != nil
		}
	}
	return out
}

// account adds to loss the pass's router load-balancing loss times router_aux_loss_coef (when
// output_router_logits) and share, the micro-batch's share of its mini-batch's sequences, and returns
// the pass's routing figures.
func (r *routing) account(sc policy.Scores, loss *ts.Tensor, share float64) (*ts.Tensor, routeCounts) {
	var c routeCounts
	if sc.RouterAux != nil {
		c.aux, c.weight = share*sc.RouterAux.Float64Values()[0], share
		if r != nil && r.auxCoef > 0 {
			loss = loss.MustAdd(sc.RouterAux.MustMulScalar(ts.FloatScalar(share*r.auxCoef), false).MustTotype(loss.DType(), true), false)
		}
	}
	c.stats.Add(sc.Routes)
	return loss, c
}

// routeCounts are a model's routing figures summed over its training passes: per layer, the tokens
// with the generator's experts known, those routed elsewhere and those whose live top-k differs
// (policy.RouteStats), and the router's load-balancing loss summed over the micro-batches.
type routeCounts struct {
	stats policy.RouteStats
	aux   float64
	// aux sums the micro-batches' losses times their weights (their shares of their mini-batch's
	// sequences); weight sums the weights.
	weight float64
}

func (c *routeCounts) add(o routeCounts) {
	c.stats.Add(&o.stats)
	c.aux, c.weight = c.aux+o.aux, c.weight+o.weight
}

// values are the counts in a fixed order for a sum over ranks (layers entries each); set reads them
// back.
func (c *routeCounts) values(layers int) []float64 {
	v := []float64{c.aux, c.weight}
	for _, s := range [][]int64{c.stats.Tokens, c.stats.Used, c.stats.Live} {
		for l := range layers {
			x := 0.0
			if l < len(s) {
				x = float64(s[l])
			}
			v = append(v, x)
		}
	}
	return v
}

func (c *routeCounts) set(v []float64, layers int) {
	c.aux, c.weight = v[0], v[1]
	ints := func(f []float64) []int64 {
		out := make([]int64, len(f))
		for i, x := range f {
			out[i] = int64(x)
		}
		return out
	}
	c.stats = policy.RouteStats{Tokens: ints(v[2 : 2+layers]), Used: ints(v[2+layers : 2+2*layers]), Live: ints(v[2+2*layers : 2+3*layers])}
}

// addRouting writes a mixture-of-experts model's routing figures: the router's load-balancing loss,
// and over the tokens whose generator's experts were known, the fractions routed elsewhere
// (mismatch: 0 with replay) and whose live top-k moved (drift), over all sparse layers and per
// quarter of them.
func (m Metrics) addRouting(id string, r *routing, c routeCounts) {
	if r == nil {
		return
	}
	if c.weight > 0 {
		m[metric.LossRouterAuxModel(id)] = c.aux / c.weight
	}
	frac := func(layers []int) (mismatch, drift float64, ok bool) {
		var tok, used, live int64
		for _, l := range layers {
			if l < len(c.stats.Tokens) {
				tok, used, live = tok+c.stats.Tokens[l], used+c.stats.Used[l], live+c.stats.Live[l]
			}
		}
		if tok == 0 {
			return 0, 0, false
		}
		return float64(used) / float64(tok), float64(live) / float64(tok), true
	}
	if mm, dr, ok := frac(r.layers); ok {
		m[metric.RoutingMismatchModel(id)], m[metric.RoutingDriftModel(id)] = mm, dr
	}
	if len(r.layers) < 2 {
		return
	}
	step := (len(r.layers) + 3) / 4
	for i := 0; i < len(r.layers); i += step {
		part := r.layers[i:min(i+step, len(r.layers))]
		name := fmt.Sprintf("%d-%d", part[0], part[len(part)-1])
		if mm, dr, ok := frac(part); ok {
			m[metric.RoutingMismatchLayers(id, name)], m[metric.RoutingDriftLayers(id, name)] = mm, dr
		}
	}
}
