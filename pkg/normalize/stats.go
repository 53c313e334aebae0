package normalize

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/drmas/drmas/pkg/jsonl"
)

// Stats summarizes one Compute call: the per-agent figures training logs each iteration, the group
// counts, and the statistics of every prompt group.
type Stats struct {
	Options      Options `json:"options"`
	Samples      int     `json:"samples"`
	Groups       int     `json:"groups"` // prompt groups (distinct uids)
	Trajectories int     `json:"trajectories"`

	// NormGroups counts the normalization groups: the groups σ is computed over (the uids for
	// std: global, the (uid, agent) pairs for std: agent) or, with std: none, the groups μ is computed
	// over. ZeroStdGroups counts those with at least two weighting units whose values are all equal
	// (σ = 0, so A = 0 in the pure combos); FracZeroStd = ZeroStdGroups / NormGroups (0 when there are
	// none). SingletonGroups counts those with one unit, which take μ = 0, σ = 1 and are not zero-std.
	NormGroups      int     `json:"norm_groups"`
	ZeroStdGroups   int     `json:"zero_std_groups"`
	FracZeroStd     float64 `json:"frac_zero_std"`
	SingletonGroups int     `json:"singleton_groups"`
	// MinStdApplied counts the normalization groups whose σ was below MinStd and was raised to it
	// (always 0 when MinStd is 0 or std is none).
	MinStdApplied int `json:"min_std_applied"`

	Agents   []AgentStats `json:"agents"`    // sorted by name
	PerGroup []GroupStats `json:"per_group"` // in order of each uid's first sample
}

// AgentStats describes one agent's calls across all groups. Means and stds here are descriptive:
// population figures over the calls.
type AgentStats struct {
	Agent     string  `json:"agent"`
	Calls     int     `json:"calls"`
	Groups    int     `json:"groups"` // prompt groups the agent was called in
	ScoreMean float64 `json:"score_mean"`
	ScoreStd  float64 `json:"score_std"`
	AdvMean   float64 `json:"adv_mean"`
	AdvStd    float64 `json:"adv_std"`
	AdvMin    float64 `json:"adv_min"`
	AdvMax    float64 `json:"adv_max"`
	// Inflation is the Lemma 4.2 factor (σ_k² + (μ_k − μ)²)/σ², averaged over the InflationGroups
	// groups where the agent was called and the global σ is > 0 (at least two trajectories, not all
	// equal). It is the predicted ratio of the agent's squared gradient norm under global GRPO to that
	// under agent-wise normalization. NaN when InflationGroups is 0 (null in JSON).
	Inflation       float64 `json:"inflation"`
	InflationGroups int     `json:"inflation_groups"`
	// Energy is ΣA² over the agent's calls. Lemma 4.2 models an agent's squared gradient norm as
	// proportional to it, so the ratio of two estimators' energies on the same rollout predicts the
	// ratio of the agent's squared gradient norms under them (see Compare).
	Energy float64 `json:"energy"`
}

// GroupStats describes one prompt group.
type GroupStats struct {
	UID          string `json:"uid"`
	Trajectories int    `json:"trajectories"`
	Calls        int    `json:"calls"`
	// Mean and Std are μ and σ over the trajectory averages, after the one-sample rule (one trajectory:
	// 0 and 1) and before the MinStd floor.
	Mean   float64           `json:"mean"`
	Std    float64           `json:"std"`
	Agents []GroupAgentStats `json:"agents"` // sorted by name
}

// GroupAgentStats describes one agent within one prompt group, or under agent-turn grouping one turn of
// one agent.
type GroupAgentStats struct {
	Agent string `json:"agent"`
	// Turn is, under agent-turn grouping, the turn whose calls the entry describes; −1 (no "turn" in
	// JSON) for an entry of all the agent's calls in the group.
	Turn  int `json:"turn"`
	Calls int `json:"calls"`
	Units int `json:"units"` // weighting units: calls (step) or trajectories (trajectory)
	// Mean and Std are μ_k and σ_k under the options' weighting and std estimator, after the one-sample
	// rule and before the MinStd floor.
	Mean float64 `json:"mean"`
	Std  float64 `json:"std"`
	// Inflation is this group's Lemma 4.2 factor; NaN (null in JSON) when the global σ is 0 or the
	// group has one trajectory.
	Inflation float64 `json:"inflation"`
}

// MarshalJSON writes a NaN inflation as null.
func (a AgentStats) MarshalJSON() ([]byte, error) {
	type plain AgentStats
	return json.Marshal(struct {
		plain
		Inflation jsonl.Num `json:"inflation"`
	}{plain(a), jsonl.Num(a.Inflation)})
}

// MarshalJSON writes a NaN inflation as null and leaves out a negative turn.
func (a GroupAgentStats) MarshalJSON() ([]byte, error) {
	type plain GroupAgentStats
	var turn *int
	if a.Turn >= 0 {
		turn = &a.Turn
	}
	return json.Marshal(struct {
		plain
		Turn      *int      `json:"turn,omitempty"`
		Inflation jsonl.Num `json:"inflation"`
	}{plain(a), turn, jsonl.Num(a.Inflation)})
}

// WriteTable writes the per-agent statistics and the group counts as an aligned text table.
func (s Stats) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agent\tcalls\tgroups\tscore_mean\tscore_std\tadv_mean\tadv_std\tadv_min\tadv_max\tinflation\tinfl_groups\t")
	for _, a := range s.Agents {
		infl := "-"
		if !math.IsNaN(a.Inflation) {
			infl = fmt.Sprintf("%.4g", a.Inflation)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t%s\t%d\t\n",
			a.Agent, a.Calls, a.Groups, a.ScoreMean, a.ScoreStd, a.AdvMean, a.AdvStd, a.AdvMin, a.AdvMax, infl, a.InflationGroups)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%s\nsamples %d, groups %d, trajectories %d; normalization groups %d: zero-std %d (frac_zero_std %.4g), one-sample %d, min_std applied %d\n",
		s.Options, s.Samples, s.Groups, s.Trajectories, s.NormGroups, s.ZeroStdGroups, s.FracZeroStd, s.SingletonGroups, s.MinStdApplied)
	return err
}
