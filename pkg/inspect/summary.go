package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/drmas/drmas/pkg/jsonl"
)

// Defaults of the spike rule.
const (
	DefaultSpikeFactor = 5
	DefaultWindow      = 20
)

// Options is the spike rule: a norm is a spike when it exceeds Factor × the median of the previous Window
// finite norms (see Spikes) and also exceeds MinNorm.
type Options struct {
	Factor  float64 `json:"spike_factor"`
	Window  int     `json:"window"`
	MinNorm float64 `json:"min_norm"` // 0 = off; docs/toy-tasks.md counted spikes above 1 (the clip threshold)
}

// DefaultOptions returns factor 5, window 20, no floor.
func DefaultOptions() Options { return Options{Factor: DefaultSpikeFactor, Window: DefaultWindow} }

// Validate checks the rule.
func (o Options) Validate() error {
	if !(o.Factor > 0) || math.IsInf(o.Factor, 0) {
		return fmt.Errorf("spike factor %v: want a positive number", o.Factor)
	}
	if o.Window < 1 {
		return fmt.Errorf("window %d: want at least 1", o.Window)
	}
	if !(o.MinNorm >= 0) || math.IsInf(o.MinNorm, 0) {
		return fmt.Errorf("minimum spike norm %v: want a number ≥ 0", o.MinNorm)
	}
	return nil
}

// spikeSteps returns the steps of s's spikes under o.
func (o Options) spikeSteps(s Series) []int {
	steps := []int{}
	for _, i := range Spikes(s.Values, o.Factor, o.Window) {
		if s.Values[i] > o.MinNorm {
			steps = append(steps, s.Steps[i])
		}
	}
	return steps
}

// Num is a float that encodes as JSON null when it is not finite (an empty series' median, say).
type Num = jsonl.Num

// Norms summarizes one gradient-norm series.
type Norms struct {
	Name       string `json:"name"`
	Points     int    `json:"points"`    // rows with this key
	NonFinite  int    `json:"nonfinite"` // of them, null (not finite)
	Median     Num    `json:"median"`    // over the finite values
	P95        Num    `json:"p95"`       // linear interpolation between ranks
	Max        Num    `json:"max"`
	Spikes     int    `json:"spikes"`
	SpikeSteps []int  `json:"spike_steps"`
}

// AgentSummary is one agent's report in one run.
type AgentSummary struct {
	Norms
	Model string `json:"model,omitempty"` // the model it trains, from the run's config
	// SkippedSteps sums nonfinite/model/<Model>: optimizer steps skipped for a non-finite norm. Nil when the
	// agent's model is unknown. A shared model's skips count for each of its agents.
	SkippedSteps *int `json:"skipped_steps"`
	Inflation    Num  `json:"inflation"` // mean of the finite inflation/agent/<a> values; null if none
	// EnergyRatio is the mean of the finite adv_energy_ratio/agent/<a> values, ΣA²(GRPO)/ΣA²(Dr. MAS)
	// on each rollout; null if none (runs from before the key was logged).
	EnergyRatio Num `json:"energy_ratio"`
	// Verdict judges EnergyRatio by the dial study's thresholds (Judge); empty without one. Where the
	// agent's σ_k collapses in some groups, it cites that (SigmaNote).
	Verdict string `json:"verdict,omitempty"`
	// Sigma summarizes the agent's σ_k diagnostics; nil when the run does not log them.
	Sigma *SigmaSummary `json:"sigma,omitempty"`
}

// SigmaSummary is one agent's σ_k over a run (adv_std/agent/<a>/*, adv_norm/agent/<a>/abs_max): the
// smallest σ_k of any of its groups, the mean of the iterations' median σ_k, the mean fraction of its
// groups with σ_k < 0.01, and the largest |A| of its calls. Null where not logged.
type SigmaSummary struct {
	Min      Num `json:"min"`
	Median   Num `json:"median"`
	FracLow  Num `json:"frac_below_0.01"`
	AbsAdMax Num `json:"abs_adv_max"`
}

// SigmaLow is the σ_k below which a group counts as collapsed in SigmaNote (adv_std's 0.01).
const SigmaLow = 0.01

// sigmaSummary reads agent a's σ_k series; nil when there are none.
func sigmaSummary(run *Run, a string) *SigmaSummary {
	s := func(m map[string]Series, stat string) []float64 { return m[a+"/"+stat].Values }
	if len(s(run.Sigma, "median")) == 0 && len(s(run.AbsAdv, "abs_max")) == 0 {
		return nil
	}
	extreme := func(vs []float64, f func(float64, float64) float64) Num {
		sorted := finiteSorted(vs)
		if len(sorted) == 0 {
			return Num(math.NaN())
		}
		return Num(f(sorted[0], sorted[len(sorted)-1]))
	}
	return &SigmaSummary{
		Min:      extreme(s(run.Sigma, "min"), func(lo, _ float64) float64 { return lo }),
		Median:   Num(mean(s(run.Sigma, "median"))),
		FracLow:  Num(mean(s(run.Sigma, "frac_below_0.01"))),
		AbsAdMax: extreme(s(run.AbsAdv, "abs_max"), func(_, hi float64) float64 { return hi }),
	}
}

// SigmaNote is what the verdict cites when the agent's σ_k collapses (below SigmaLow) in some of its
// groups: Dr. MAS divides those groups' small score differences by a tiny σ_k, so their advantages
// are ±O(1) however small the differences; "" when it does not.
func (s *SigmaSummary) SigmaNote() string {
	if s == nil || !(float64(s.FracLow) > 0) {
		return ""
	}
	return fmt.Sprintf("σ_k < %g in %.0f%% of its groups (min σ_k %s, max |A| %s): agent-wise normalization "+
		"scales their small score differences to |A| ≈ 1 (algorithm.normalization.min_std bounds that)",
		SigmaLow, 100*float64(s.FracLow), fnum(float64(s.Min)), fnum(float64(s.AbsAdMax)))
}

// ModelSummary is one model's report in one run.
type ModelSummary struct {
	Norms
	SkippedSteps int `json:"skipped_steps"` // sum of nonfinite/model/<id>
}

// RunSummary is one run's report.
type RunSummary struct {
	Label          string         `json:"label"`
	File           string         `json:"file"`
	Config         string         `json:"config,omitempty"`
	Normalization  string         `json:"normalization,omitempty"`
	Rows           int            `json:"rows"`
	FirstStep      int            `json:"first_step"`
	LastStep       int            `json:"last_step"`
	MalformedLines int            `json:"malformed_lines"`
	DuplicateSteps int            `json:"duplicate_steps"`
	Spikes         int            `json:"spikes"` // over the agents (over the models when there are no agent series)
	Agents         []AgentSummary `json:"agents"`
	Models         []ModelSummary `json:"models"`
	Warnings       []Warning      `json:"warnings"`
}

// Report is the result of inspect-grads: the spike rule and one summary per run, in the order given.
type Report struct {
	Options
	Runs []RunSummary `json:"runs"`
}

// Summarize reports on runs under the spike rule opt. warnings[i], if given, are run i's reading
// warnings, kept in the report. A label used by an earlier run gets a " #2", " #3" … suffix, so that the
// comparison's columns stay apart.
func Summarize(runs []*Run, warnings [][]Warning, opt Options) (*Report, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{Options: opt}
	used := map[string]int{}
	for i, run := range runs {
		s := summarizeRun(run, opt)
		if used[s.Label]++; used[s.Label] > 1 {
			s.Label = fmt.Sprintf("%s #%d", s.Label, used[s.Label])
		}
		s.Warnings = []Warning{}
		if i < len(warnings) && warnings[i] != nil {
			s.Warnings = warnings[i]
		}
		rep.Runs = append(rep.Runs, s)
	}
	return rep, nil
}

func summarizeRun(run *Run, opt Options) RunSummary {
	s := RunSummary{
		Label: run.Label, File: run.File, Config: run.Config, Normalization: run.Normalization,
		Rows: len(run.Steps), MalformedLines: run.Malformed, DuplicateSteps: run.Duplicates,
		Agents: []AgentSummary{}, Models: []ModelSummary{},
	}
	if n := len(run.Steps); n > 0 {
		s.FirstStep, s.LastStep = run.Steps[0], run.Steps[n-1]
	}
	skipped := map[string]int{}
	for _, id := range run.Models() {
		for _, v := range run.Nonfinite[id].Values {
			if finite(v) {
				skipped[id] += int(v)
			}
		}
		m := ModelSummary{Norms: summarizeNorms(id, run.GradModel[id], opt), SkippedSteps: skipped[id]}
		s.Models = append(s.Models, m)
	}
	for _, a := range run.Agents() {
		as := AgentSummary{Norms: summarizeNorms(a, run.GradAgent[a], opt), Inflation: Num(mean(run.Inflation[a].Values)),
			EnergyRatio: Num(mean(run.Energy[a].Values))}
		as.Sigma = sigmaSummary(run, a)
		if e := float64(as.EnergyRatio); finite(e) {
			as.Verdict = Judge(a, e, math.NaN()).Text
			if note := as.Sigma.SigmaNote(); note != "" {
				as.Verdict += "; " + note
			}
		}
		if model, ok := run.AgentModel[a]; ok {
			as.Model = model
			n := skipped[model]
			as.SkippedSteps = &n
		}
		s.Agents = append(s.Agents, as)
		s.Spikes += as.Spikes
	}
	if len(s.Agents) == 0 {
		for _, m := range s.Models {
			s.Spikes += m.Spikes
		}
	}
	return s
}

func summarizeNorms(name string, s Series, opt Options) Norms {
	sorted := finiteSorted(s.Values)
	steps := opt.spikeSteps(s)
	n := Norms{
		Name: name, Points: len(s.Values), NonFinite: len(s.Values) - len(sorted),
		Median: Num(quantile(sorted, 0.5)), P95: Num(quantile(sorted, 0.95)), Max: Num(math.NaN()),
		Spikes: len(steps), SpikeSteps: steps,
	}
	if len(sorted) > 0 {
		n.Max = Num(sorted[len(sorted)-1])
	}
	return n
}

// mean returns the mean of the finite values of vs; NaN if there are none.
func mean(vs []float64) float64 {
	sum, n := 0.0, 0
	for _, v := range vs {
		if finite(v) {
			sum += v
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}
