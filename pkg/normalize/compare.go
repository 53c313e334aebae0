package normalize

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/drmas/drmas/pkg/jsonl"
)

// Estimator is a named estimator, one row group of a Comparison.
type Estimator struct {
	Name    string  `json:"name"`
	Options Options `json:"options"`
}

// Comparison holds several estimators' advantages on the same samples, per agent, with each agent's
// advantage energy ΣA² relative to that under the Base estimator.
type Comparison struct {
	Samples      int                `json:"samples"`
	Groups       int                `json:"groups"`
	Trajectories int                `json:"trajectories"`
	Base         string             `json:"base"` // the estimator energies are relative to ("" when none)
	Estimators   []EstimatorSummary `json:"estimators"`
}

// EstimatorSummary is one estimator of a Comparison.
type EstimatorSummary struct {
	Name          string             `json:"name"`
	Options       Options            `json:"options"`
	NormGroups    int                `json:"norm_groups"`
	FracZeroStd   float64            `json:"frac_zero_std"`
	MinStdApplied int                `json:"min_std_applied"`
	Agents        []AgentComparison  `json:"agents"` // sorted by name
	energy        map[string]float64 // Energy by agent
}

// AgentComparison is one agent's advantages under one estimator.
type AgentComparison struct {
	Agent   string  `json:"agent"`
	Calls   int     `json:"calls"`
	AdvMean float64 `json:"adv_mean"`
	AdvStd  float64 `json:"adv_std"`
	AdvMin  float64 `json:"adv_min"`
	AdvMax  float64 `json:"adv_max"`
	// Energy is ΣA² over the agent's calls; EnergyRatio = Energy / Energy under the base estimator,
	// NaN (null in JSON) where the base energy is 0 or there is no base. By Lemma 4.2 the ratio
	// predicts the ratio of the agent's squared gradient norms under the two estimators.
	Energy      float64 `json:"energy"`
	EnergyRatio float64 `json:"energy_ratio"`
	// Inflation is the agent's Lemma 4.2 factor (the same under every estimator), NaN (null) when
	// undefined.
	Inflation float64 `json:"inflation"`
}

// MarshalJSON writes NaN figures as null.
func (a AgentComparison) MarshalJSON() ([]byte, error) {
	type plain AgentComparison
	return json.Marshal(struct {
		plain
		EnergyRatio jsonl.Num `json:"energy_ratio"`
		Inflation   jsonl.Num `json:"inflation"`
	}{plain(a), jsonl.Num(a.EnergyRatio), jsonl.Num(a.Inflation)})
}

// Compare computes every estimator's advantages on samples and summarizes them per agent; energies are
// relative to the estimator named base (no ratios if base names none of them). An error names the
// estimator whose options are invalid, or a bad score.
func Compare(samples []Sample, estimators []Estimator, base string) (Comparison, error) {
	stats := make([]Stats, len(estimators))
	for i, e := range estimators {
		res, err := Compute(samples, e.Options)
		if err != nil {
			return Comparison{}, fmt.Errorf("estimator %s: %w", e.Name, err)
		}
		stats[i] = res.Stats
	}
	return summarize(len(samples), estimators, stats, base), nil
}

// CompareFile is Compare on the samples of a scanned file, streamed: the groups are read back one at
// a time and fed to every estimator's Stream, so that memory is the file's index and the largest
// group (plus each estimator's per-agent sums), never the samples. Its result is Compare's on the
// file's samples (ReadRecords), bit for bit.
func CompareFile(sf *SamplesFile, estimators []Estimator, base string) (Comparison, error) {
	streams := make([]*Stream, len(estimators))
	for i, e := range estimators {
		st, err := NewStream(e.Options)
		if err != nil {
			return Comparison{}, fmt.Errorf("estimator %s: %w", e.Name, err)
		}
		st.DropGroupStats() // a comparison reports per agent, not per group
		streams[i] = st
	}
	err := sf.EachGroup(func(samples []Sample) error {
		for i, st := range streams {
			if _, err := st.Group(samples); err != nil {
				return fmt.Errorf("estimator %s: %w", estimators[i].Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return Comparison{}, err
	}
	stats := make([]Stats, len(estimators))
	for i, st := range streams {
		stats[i] = st.Finish()
	}
	return summarize(sf.Len(), estimators, stats, base), nil
}

// summarize builds the comparison of n samples from each estimator's statistics.
func summarize(n int, estimators []Estimator, stats []Stats, base string) Comparison {
	out := Comparison{Samples: n}
	baseIdx := -1
	for i, e := range estimators {
		st := stats[i]
		out.Groups, out.Trajectories = st.Groups, st.Trajectories
		sum := EstimatorSummary{Name: e.Name, Options: e.Options, NormGroups: st.NormGroups, FracZeroStd: st.FracZeroStd,
			MinStdApplied: st.MinStdApplied, energy: map[string]float64{}}
		for _, a := range st.Agents {
			sum.Agents = append(sum.Agents, AgentComparison{Agent: a.Agent, Calls: a.Calls, AdvMean: a.AdvMean, AdvStd: a.AdvStd,
				AdvMin: a.AdvMin, AdvMax: a.AdvMax, Energy: a.Energy, EnergyRatio: math.NaN(), Inflation: a.Inflation})
			sum.energy[a.Agent] = a.Energy
		}
		if e.Name == base && baseIdx < 0 {
			baseIdx = i
		}
		out.Estimators = append(out.Estimators, sum)
	}
	if baseIdx >= 0 {
		out.Base = base
		ref := out.Estimators[baseIdx].energy
		for _, e := range out.Estimators {
			for j := range e.Agents {
				e.Agents[j].EnergyRatio = energyRatio(e.Agents[j].Energy, ref[e.Agents[j].Agent])
			}
		}
	}
	return out
}

// energyRatio is ΣA²(x) / ΣA²(base), NaN when the base energy is 0 (every advantage 0 there).
func energyRatio(energy, base float64) float64 {
	if base == 0 {
		return math.NaN()
	}
	return energy / base
}

// EnergyRatios returns per agent ΣA²(GRPO) / ΣA²(Dr. MAS) on the same samples: the reference-code GRPO
// and Dr. MAS, both with the ε, std estimator and min_std of opt. NaN where Dr. MAS gives the agent
// only zero advantages. Training logs it as adv_energy_ratio/agent/<a> (from ComputeResolved, which
// computes it with the advantages).
func EnergyRatios(samples []Sample, opt Options) (map[string]float64, error) {
	_, drmas := references(opt)
	if err := drmas.Validate(); err != nil { // the references share ε, the std estimator and min_std
		return nil, fmt.Errorf("normalize: %w", err)
	}
	idx, err := indexOf(samples)
	if err != nil {
		return nil, err
	}
	return energyRatios(samples, opt, idx, nil), nil
}

// references returns the reference-code GRPO and Dr. MAS with the ε, std estimator and min_std of opt.
func references(opt Options) (grpo, drmas Options) {
	grpo, drmas = GRPO(), DrMAS()
	for _, o := range []*Options{&grpo, &drmas} {
		o.Eps, o.Unbiased, o.MinStd = opt.Eps, opt.Unbiased, opt.MinStd
	}
	return grpo, drmas
}

// energyRatios computes the energy ratios of EnergyRatios on the indexed samples. When optStats, the
// statistics of a pass under opt, is given and opt is one of the references, that reference's
// energies are taken from it rather than computed again (a pass under the same options gives the
// same energies, bit for bit).
func energyRatios(samples []Sample, opt Options, idx index, optStats *Stats) map[string]float64 {
	grpo, drmas := references(opt)
	agents := func(ref Options) []AgentStats {
		if optStats != nil && sameEstimator(ref, opt) {
			return optStats.Agents
		}
		return run(samples, ref, idx, true).Stats.Agents
	}
	base := map[string]float64{}
	for _, a := range agents(drmas) {
		base[a.Agent] = a.Energy
	}
	out := map[string]float64{}
	for _, a := range agents(grpo) {
		out[a.Agent] = energyRatio(a.Energy, base[a.Agent])
	}
	return out
}

// sameEstimator reports whether a and b, neither with per-agent overrides, are the same estimator.
func sameEstimator(a, b Options) bool {
	return len(a.Agents) == 0 && len(b.Agents) == 0 &&
		a.Mean == b.Mean && a.Std == b.Std && a.Weighting == b.Weighting && a.Eps == b.Eps &&
		a.Unbiased == b.Unbiased && a.MinStd == b.MinStd && a.Group == b.Group && a.Global == b.Global
}

// WriteTable writes the comparison as one aligned table, a row per agent and estimator.
func (c Comparison) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	ratio := "energy/" + c.Base
	if c.Base == "" {
		ratio = "energy/-"
	}
	fmt.Fprintf(tw, "agent\testimator\tcalls\tadv_mean\tadv_std\tadv_min\tadv_max\tenergy ΣA²\t%s\tinflation\t\n", ratio)
	for _, name := range c.agents() {
		for _, e := range c.Estimators {
			for _, a := range e.Agents {
				if a.Agent != name {
					continue
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t%s\t%s\t\n", a.Agent, e.Name, a.Calls,
					a.AdvMean, a.AdvStd, a.AdvMin, a.AdvMax, a.Energy, orDash(a.EnergyRatio), orDash(a.Inflation))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "samples %d, groups %d, trajectories %d\n", c.Samples, c.Groups, c.Trajectories); err != nil {
		return err
	}
	for _, e := range c.Estimators {
		_, err := fmt.Fprintf(w, "%s: %s; normalization groups %d, frac_zero_std %.4g, min_std applied %d\n",
			e.Name, e.Options, e.NormGroups, e.FracZeroStd, e.MinStdApplied)
		if err != nil {
			return err
		}
	}
	return nil
}

// agents lists the agent names in order of first appearance across the estimators (each sorted).
func (c Comparison) agents() []string {
	var names []string
	seen := map[string]bool{}
	for _, e := range c.Estimators {
		for _, a := range e.Agents {
			if !seen[a.Agent] {
				seen[a.Agent] = true
				names = append(names, a.Agent)
			}
		}
	}
	return names
}

func orDash(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return fmt.Sprintf("%.4g", v)
}
