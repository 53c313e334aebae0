package train

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/rs/zerolog/log"
	"github.com/schollz/progressbar/v3"

	"github.com/drmas/drmas/pkg/metric"
)

// progress reports a run's iterations: a log line each, and a progress bar on a terminal.
type progress struct {
	bar  *progressbar.ProgressBar // nil: logs only
	valK int                      // the validation avg@k reported
}

// newProgress draws a bar of steps iterations on w (nil: none), starting at step.
func newProgress(w io.Writer, steps, step, valK int) *progress {
	p := &progress{valK: valK}
	if w == nil {
		return p
	}
	p.bar = progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("train"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish())
	_ = p.bar.Set(step)
	return p
}

// finish completes the bar.
func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

// report logs an iteration and advances the progress bar.
func (p *progress) report(m Metrics) {
	bar := p.bar
	var norms []string
	keys := make([]string, 0)
	for k := range m {
		if strings.HasPrefix(k, "grad_norm/agent/") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	ev := log.Info().Int("step", int(m["step"])).Float64("reward", round(m["reward/mean"]))
	if bar != nil {
		ev = log.Debug().Int("step", int(m["step"])).Float64("reward", round(m["reward/mean"]))
	}
	for _, k := range keys {
		a := strings.TrimPrefix(k, "grad_norm/agent/")
		norms = append(norms, fmt.Sprintf("%s %.3g", a, m[k]))
		ev = ev.Float64("gn_"+a, round(m[k]))
	}
	if v, ok := m["val/avg@"+fmt.Sprint(p.valK)]; ok {
		ev = ev.Float64("val_avg", round(v))
	}
	if v, ok := m[metric.PerfTokensPerS]; ok {
		ev = ev.Float64("tok_s", math.Round(v))
	}
	ev.Float64("iter_s", round(m["time/iteration"])).Msg("iteration")
	if bar != nil {
		bar.Describe(fmt.Sprintf("reward %.3f | grad %s", m["reward/mean"], strings.Join(norms, ", ")))
		_ = bar.Set(int(m["step"]))
	}
}

func round(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	return math.Round(x*1e4) / 1e4
}
