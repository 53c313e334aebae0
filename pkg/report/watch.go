package report

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/metric"
)

// FailureShare is the share of an iteration's trajectories whose reward the judge or the remote
// endpoint failed to give (scored with error_score instead) above which the terminal says so.
const FailureShare = 0.1

// watch keeps what went wrong over a run, for the end summary: the trajectories the judge or the
// remote reward failed to score, and the optimizer steps skipped for a non-finite gradient norm, per
// model; and it warns on the terminal about an iteration whose rewards failed often.
type watch struct {
	rewardFailed, rewardTried float64
	skipped                   map[string]float64 // model → steps skipped
}

// see takes an iteration's row.
func (w *watch) see(m metric.Row) {
	failed, tried, source := m[metric.JudgeFailures], m[metric.JudgeJudged]+m[metric.JudgeFailures], "the judge (reward.judge)"
	if _, ok := m[metric.RemoteCalls]; ok {
		failed, tried, source = m[metric.RemoteFailures], m[metric.RemoteCalls], "the remote reward (reward.remote)"
	}
	w.rewardFailed, w.rewardTried = w.rewardFailed+failed, w.rewardTried+tried
	if tried > 0 && failed > FailureShare*tried {
		log.Warn().Int("step", int(m["step"])).Float64("failed", failed).Float64("of", tried).
			Msgf("%s failed to score %.0f of %.0f trajectories this iteration: they got reward.error_score, not a reward (its answers could not be read or it did not answer; the rollout dumps and the log say which)", source, failed, tried)
	}
	for k, v := range m {
		if id, ok := strings.CutPrefix(k, metric.NonfiniteModel("")); ok && v > 0 {
			if w.skipped == nil {
				w.skipped = map[string]float64{}
			}
			w.skipped[id] += v
		}
	}
}

// summary adds to the end summary what went wrong, where anything did.
func (w *watch) summary(ev *zerolog.Event) *zerolog.Event {
	if w.rewardFailed > 0 {
		ev = ev.Str("reward_failures", fmt.Sprintf("%.0f of %.0f trajectories scored with error_score (the judge or remote reward failed)", w.rewardFailed, w.rewardTried))
	}
	if len(w.skipped) > 0 {
		var parts []string
		for _, id := range slices.Sorted(maps.Keys(w.skipped)) {
			parts = append(parts, fmt.Sprintf("%s %.0f", id, w.skipped[id]))
		}
		ev = ev.Str("skipped_updates", strings.Join(parts, ", ")+" optimizer steps skipped: their gradient norm was not finite (nonfinite/model/*; docs/run-folder.md)")
	}
	return ev
}
