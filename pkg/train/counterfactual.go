package train

import (
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/inspect"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/torch"
)

// Normalizations compared by the counterfactual inspection: global GRPO, agent-wise Dr. MAS and the
// two ablation combinations of the paper's table 3.
var Normalizations = []struct {
	Name string
	Opt  normalize.Options
}{
	{"grpo", normalize.GRPO()},
	{"drmas", normalize.DrMAS()},
	{"mean-agent/std-global", withMeanStd(normalize.DrMAS(), normalize.Agent, normalize.Global)},
	{"mean-global/std-agent", withMeanStd(normalize.DrMAS(), normalize.Global, normalize.Agent)},
}

func withMeanStd(o normalize.Options, mean, std string) normalize.Options {
	o.Mean, o.Std = mean, std
	return o
}

// Counterfactual collects `batches` rollout batches with the team's current weights and, for each,
// computes every agent's gradient norm under each normalization of Normalizations on that same batch,
// without taking a step. Call it from an ordinary goroutine.
func Counterfactual(ctx context.Context, team *Team, batches int) (*inspect.CounterfactualReport, error) {
	cfg := team.Config
	models := newModels(cfg, team.Router, cfg.Run.Seed)
	rep := &inspect.CounterfactualReport{}
	for b := 1; b <= batches; b++ {
		roll, _, err := team.rollout(ctx, team.Router, b)
		if err != nil {
			return nil, fmt.Errorf("batch %d: %w", b, err)
		}
		samples := roll.Samples()
		ns := normSamples(samples)
		rows := map[string]*inspect.CounterfactualRow{}
		energy := map[string]map[string]float64{} // "grpo", "grpo/centered", "grpo/weighted", … → agent → figure
		weights := scoreWeights(roll, samples)
		for _, mode := range Normalizations {
			opt := mode.Opt
			n := cfg.Algorithm.Normalization
			opt.Eps, opt.Unbiased, opt.MinStd = n.Eps, !n.PopulationStd, n.MinStd
			res, err := normalize.Compute(ns, opt)
			if err != nil {
				return nil, err
			}
			if mode.Name == "grpo" {
				for _, a := range res.Stats.Agents {
					rows[a.Agent] = &inspect.CounterfactualRow{Batch: b, Agent: a.Agent, Calls: a.Calls, Norms: map[string]float64{},
						Energy: map[string]float64{}, Predicted: a.Inflation}
				}
			}
			if mode.Name == "grpo" || mode.Name == "drmas" {
				addEnergies(energy, mode.Name, samples, res.Advantages, weights)
			}
			perModel := team.itemsByModel(roll, samples, res.Advantages, nil)
			err = torch.Do(func() error {
				for _, ms := range models {
					norms, err := ms.agentNorms(perModel[ms.id])
					if err != nil {
						return err
					}
					for a, n := range norms {
						if r := rows[a]; r != nil {
							r.Norms[mode.Name] = n
						}
					}
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
		agents := make([]string, 0, len(rows))
		for a := range rows {
			agents = append(agents, a)
		}
		sort.Strings(agents)
		for _, a := range agents {
			r := rows[a]
			for k, byAgent := range energy {
				r.Energy[k] = byAgent[a]
			}
			r.Fill()
			rep.Rows = append(rep.Rows, *r)
		}
	}
	rep.Correlate()
	return rep, nil
}

// addEnergies adds, per agent, the advantages' energies under one estimator: ΣA² (key mode), the
// part of it that varies within each group's calls of the agent, Σ(A − mean of the agent's calls in
// the group)² (mode+"/centered"), and ΣA²·w with w the call's score weight (mode+"/weighted").
func addEnergies(energy map[string]map[string]float64, mode string, samples []env.Sample, adv, w []float64) {
	for _, k := range []string{mode, mode + inspect.Centered, mode + inspect.Weighted} {
		if energy[k] == nil {
			energy[k] = map[string]float64{}
		}
	}
	type key struct{ uid, agent string }
	sum, n := map[key]float64{}, map[key]float64{}
	for i, s := range samples {
		k := key{s.UID, s.Agent}
		sum[k] += adv[i]
		n[k]++
		energy[mode][s.Agent] += adv[i] * adv[i]
		energy[mode+inspect.Weighted][s.Agent] += adv[i] * adv[i] * w[i]
	}
	for i, s := range samples {
		k := key{s.UID, s.Agent}
		d := adv[i] - sum[k]/n[k]
		energy[mode+inspect.Centered][s.Agent] += d * d
	}
}

// scoreWeights gives each call Σ_t (1 − p_t)² over its response tokens, p_t the probability the
// rollout sampled token t with: the squared norm of the token's log-prob gradient with respect to
// its logit, a proxy for how much the call's score function weighs in the gradient (a near-certain
// response contributes little whatever its advantage). 0 for a call without log-probs.
func scoreWeights(roll *env.Rollout, samples []env.Sample) []float64 {
	w := make([]float64, len(samples))
	for i, s := range samples {
		for _, lp := range roll.Trajectories[s.Traj].Calls[s.Call].LogProbs {
			q := 1 - math.Exp(float64(lp))
			w[i] += q * q
		}
	}
	return w
}

// agentNorms is each agent's gradient norm on its calls, measured as in an optimizer step on them
// all, without taking the step. Torch thread.
func (ms *modelState) agentNorms(items []*item) (map[string]float64, error) {
	if len(items) == 0 {
		return nil, nil
	}
	ZeroGrad(ms.params)
	defer ZeroGrad(ms.params)
	st, err := ms.backward(newMiniBatch(items, ms.horizon, true), ms.params)
	if err != nil {
		return nil, err
	}
	norms := map[string]float64{}
	for _, a := range st.agents {
		norms[a.agent] = a.gradNorm
	}
	return norms, nil
}

// NormalizationNames lists the names of Normalizations, in order (the report's columns).
func NormalizationNames() []string {
	out := make([]string, len(Normalizations))
	for i, n := range Normalizations {
		out[i] = n.Name
	}
	return out
}
