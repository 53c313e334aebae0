package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/metric"
)

// An iteration whose judge failed to score more than FailureShare of its trajectories is warned
// about on the terminal (#52: 81 of 83 scored 0 and the console said nothing), one below it is not;
// the end summary counts the run's reward failures and its optimizer steps skipped for a non-finite
// norm, per model, and says why.
func TestWatchWarnsAndSummarizes(t *testing.T) {
	var buf bytes.Buffer
	old := log.Logger
	log.Logger = zerolog.New(&buf)
	defer func() { log.Logger = old }()
	var w watch
	w.see(metric.Row{"step": 1, metric.JudgeFailures: 81, metric.JudgeJudged: 2, metric.NonfiniteModel("small"): 2})
	if !strings.Contains(buf.String(), "failed to score 81 of 83 trajectories") {
		t.Fatalf("no warning for 81 of 83 failed: %q", buf.String())
	}
	buf.Reset()
	w.see(metric.Row{"step": 2, metric.JudgeFailures: 1, metric.JudgeJudged: 82, metric.NonfiniteModel("small"): 0})
	w.see(metric.Row{"step": 3, metric.RemoteFailures: 0, metric.RemoteCalls: 10, metric.NonfiniteModel("big"): 1})
	if buf.Len() != 0 {
		t.Fatalf("a warning for an iteration under the share: %q", buf.String())
	}
	w.summary(log.Info()).Msg("training done")
	for _, want := range []string{"82 of 176 trajectories scored with error_score", "big 1, small 2 optimizer steps skipped", "not finite"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("summary %q lacks %q", buf.String(), want)
		}
	}
}
