package env

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable prints the report for people: one row per dataset and the average row (avg@k, pass@k,
// mean reward), then per dataset and agent the calls per trajectory, invalid rate and mean
// response length.
func (r *EvalReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "dataset\tquestions\tavg@%d\tpass@%d\treward\t\n", r.K, r.K)
	total := 0
	for _, d := range r.Datasets {
		fmt.Fprintf(tw, "%s\t%d\t%.4f\t%.4f\t%.4f\t\n", d.Name, d.Questions, d.AvgAtK, d.PassAtK, d.MeanReward)
		total += d.Questions
	}
	fmt.Fprintf(tw, "average\t%d\t%.4f\t%.4f\t\t\n", total, r.AvgAtK, r.PassAtK)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "dataset\tagent\tcalls/traj\tinvalid\tresp tokens\tscore\t\n")
	row := func(name string, stats []AgentStats) {
		for _, a := range stats {
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%.1f\t%.4f\t\n", name, a.Agent, a.CallsPerTraj, a.InvalidRate, a.MeanRespToken, a.MeanScore)
		}
	}
	for _, d := range r.Datasets {
		row(d.Name, d.Agents)
	}
	if len(r.Datasets) > 1 {
		row("all", r.Agents)
	}
	return tw.Flush()
}
