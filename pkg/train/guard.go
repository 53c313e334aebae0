package train

import (
	"math"
	"slices"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/torch"
)

// The online per-agent gradient guard (algorithm.guard). Before each optimizer step, each agent's share
// of a model's gradient (the gradient of that agent's part of the mini-batch loss, measured in
// backward) is compared with the median of that agent's last `window` share norms:
//
//	spike  ⇔  ‖g_a‖ > factor · median(window_a)
//
// A spike is counted (guard/agent/<a>) and, by action, kept (log), scaled down to the threshold
// (clip: g_a ← g_a · factor·median/‖g_a‖) or left out of the step (skip: g_a ← 0); the other agents'
// shares are untouched. A non-finite share is always left out and counted (guard/nonfinite/agent/<a>).
// The window holds the finite, non-zero share norms as measured, spikes included (a share of norm 0,
// every advantage 0, carries no information about the agent's scale); the guard acts once an agent
// has `window` of them. The windows are saved in trainer.json, so a resumed run judges exactly as an
// uninterrupted one.

// guard is one model's guard state: the trailing share norms of each of its agents.
type guard struct {
	window int
	factor float64
	action string
	norms  map[string][]float64 // per agent, oldest first, at most window
}

// newGuard returns the guard of cfg, nil when it is off (window 0).
func newGuard(cfg algo.Guard) *guard {
	if cfg.Window <= 0 {
		return nil
	}
	return &guard{window: cfg.Window, factor: cfg.Factor, action: cfg.Action, norms: map[string][]float64{}}
}

// verdict is what the guard decided for one agent's share.
type verdict struct {
	spike, nonfinite bool
	scale            float64 // what the share is multiplied by: 1 kept, 0 left out, else clipped
	median           float64 // of the window, when full
}

// judge decides on an agent's share of norm ‖g_a‖ and then adds the norm to the agent's window.
func (g *guard) judge(agent string, norm float64) verdict {
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return verdict{nonfinite: true, scale: 0}
	}
	v := verdict{scale: 1}
	w := g.norms[agent]
	if len(w) >= g.window {
		v.median = median(w)
		if threshold := g.factor * v.median; norm > threshold {
			v.spike = true
			if scale, ok := guardScales[g.action]; ok { // config validated the action
				v.scale = scale(threshold, norm)
			}
		}
	}
	if norm > 0 {
		w = append(w, norm)
		g.norms[agent] = slices.Clone(w[max(0, len(w)-g.window):])
	}
	return v
}

// guardScales implements each algo.GuardActions name: the factor a spiking share of norm ‖g_a‖ is
// multiplied by, given the threshold factor · median.
var guardScales = map[string]func(threshold, norm float64) float64{
	algo.GuardLog:  func(_, _ float64) float64 { return 1 },
	algo.GuardClip: func(threshold, norm float64) float64 { return threshold / norm },
	algo.GuardSkip: func(_, _ float64) float64 { return 0 },
}

// median of a non-empty slice (the mean of the two middle values for an even length).
func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// state returns a copy of the windows for trainer.json.
func (g *guard) state() map[string][]float64 {
	out := make(map[string][]float64, len(g.norms))
	for a, w := range g.norms {
		out[a] = slices.Clone(w)
	}
	return out
}

// restore sets the windows from trainer.json, keeping at most window norms per agent.
func (g *guard) restore(st map[string][]float64) {
	g.norms = map[string][]float64{}
	for a, w := range st {
		g.norms[a] = slices.Clone(w[max(0, len(w)-g.window):])
	}
}

// applyVerdict scales the share of the gradient accumulated since before (nil = since zero) by
// v.scale, the other agents' shares untouched: g ← before + scale·(g − before). A share left out is
// restored from before exactly (a copy, so that a non-finite share leaves no trace). Torch thread.
func applyVerdict(params, before []*ts.Tensor, v verdict, model, agent string, norm float64) {
	switch {
	case v.nonfinite:
		log.Warn().Str("model", model).Str("agent", agent).Float64("share_norm", norm).
			Msg("gradient guard: the agent's share of the gradient is not finite: left out of the step")
	case v.spike:
		log.Warn().Str("model", model).Str("agent", agent).Float64("share_norm", norm).Float64("median", v.median).
			Float64("scale", v.scale).Msg("gradient guard: the agent's share of the gradient spiked")
	}
	if v.scale == 1 {
		return
	}
	s := torch.NewScope()
	defer s.Close()
	_ = torch.NoGrad(func() error {
		for i, p := range params {
			g := p.MustGrad(false)
			if !g.MustDefined() {
				continue
			}
			switch {
			case v.scale == 0 && before == nil:
				g.MustZero_()
			case v.scale == 0:
				g.Copy_(before[i])
			case before == nil:
				g.MustMulScalar_(ts.FloatScalar(v.scale))
			default: // before + scale·(g − before)
				g.MustSub_(before[i])
				g.MustMulScalar_(ts.FloatScalar(v.scale))
				g.MustAdd_(before[i])
			}
		}
		return nil
	})
}
