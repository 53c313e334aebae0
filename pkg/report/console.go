package report

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog/log"
	"github.com/schollz/progressbar/v3"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/metric"
)

// progress reports a run's iterations: a log line each, and on a terminal a progress bar that also
// moves within an iteration — the rollout's calls and tokens as each batch of generations returns,
// then each model's mini-batches — with the time left for the run.
type progress struct {
	bar   *progressbar.ProgressBar // nil: logs only
	valK  int                      // the validation avg@k reported
	steps int
	last  string // the last iteration's summary, kept on the bar during the next one

	mu          sync.Mutex // the rollout's counts (generations may return concurrently)
	calls       int
	tokens      int
	done, total int // trajectories finished, of how many (this rank's share)
	began       time.Time
	it          int
}

// barUnits is how finely the bar divides an iteration: the rollout fills its first half, the update
// the second.
const barUnits = 100

// newProgress draws a bar of steps iterations on w (nil: none), starting at step.
func newProgress(w io.Writer, steps, step, valK int) *progress {
	p := &progress{valK: valK, steps: steps}
	if w == nil {
		return p
	}
	p.bar = progressbar.NewOptions(steps*barUnits,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(fmt.Sprintf("iteration %d/%d", step, steps)),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish())
	_ = p.bar.Set(step * barUnits)
	return p
}

// finish completes the bar.
func (p *progress) finish() {
	if p != nil && p.bar != nil {
		_ = p.bar.Finish()
	}
}

// show puts iteration it's phase on the bar, at frac (0–1) of the iteration.
func (p *progress) show(it int, frac float64, phase string) {
	if p == nil || p.bar == nil {
		return
	}
	desc := fmt.Sprintf("iteration %d/%d: %s", it, p.steps, phase)
	if p.last != "" {
		desc += " | " + p.last
	}
	p.bar.Describe(desc)
	_ = p.bar.Set((it-1)*barUnits + int(math.Min(frac, 0.99)*barUnits))
}

// generator counts iteration it's rollout on the bar as gen's batches return (calls, tokens and
// tokens per second) and, with trajectories, as trajectories finish (the bar's position within the
// iteration's first half).
func (p *progress) generator(gen llm.Generator, it int) llm.Generator {
	if p == nil || p.bar == nil {
		return gen
	}
	p.mu.Lock()
	p.calls, p.tokens, p.done, p.total, p.began, p.it = 0, 0, 0, 0, time.Now(), it
	p.mu.Unlock()
	p.show(it, 0, "rollout")
	return countingGen{gen: gen, p: p, it: it}
}

// trajectories is the rollout's env.RunOptions.Progress: trajectories finished of the total.
func (p *progress) trajectories() func(done, total int) {
	if p == nil || p.bar == nil {
		return nil
	}
	return func(done, total int) {
		p.mu.Lock()
		p.done, p.total = done, total
		p.mu.Unlock()
		p.rollout()
	}
}

// rollout shows the rollout's progress: trajectories finished (which set the bar's position within
// the iteration's first half), calls, tokens and tokens per second.
func (p *progress) rollout() {
	p.mu.Lock()
	calls, tokens, done, total, secs, it := p.calls, p.tokens, p.done, p.total, time.Since(p.began).Seconds(), p.it
	p.mu.Unlock()
	frac := 0.0
	if total > 0 {
		frac = 0.5 * float64(done) / float64(total)
	}
	p.show(it, frac, fmt.Sprintf("rollout %d/%d trajectories, %d calls, %d tokens, %.0f tokens/s", done, total, calls, tokens, float64(tokens)/max(secs, 1e-9)))
}

type countingGen struct {
	gen llm.Generator
	p   *progress
	it  int
}

func (g countingGen) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	out, err := g.gen.Generate(ctx, reqs)
	p := g.p
	p.mu.Lock()
	p.calls += len(out)
	for _, c := range out {
		p.tokens += len(c.ResponseIDs)
	}
	p.mu.Unlock()
	p.rollout()
	return out, err
}

// miniBatch returns the update's report for model id (the i-th of n models): mini-batch k of m done.
func (p *progress) miniBatch(it int, id string, i, n int) func(k, m int) {
	return func(k, m int) {
		p.show(it, 0.5+0.5*(float64(i)+float64(k)/float64(max(m, 1)))/float64(max(n, 1)), fmt.Sprintf("update %s, mini-batch %d/%d", id, k, m))
	}
}

// report logs an iteration and advances the progress bar to its end.
func (p *progress) report(m metric.Row) {
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
		step := int(m["step"])
		p.last = fmt.Sprintf("reward %.3f, grad %s", m["reward/mean"], strings.Join(norms, ", "))
		bar.Describe(fmt.Sprintf("iteration %d/%d done | %s", step, p.steps, p.last))
		_ = bar.Set(step * barUnits)
	}
}

func round(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	return math.Round(x*1e4) / 1e4
}

// Terminal is a terminal shared by the progress bar and the logs (Options.Progress, and the log
// writer Log returns): a log line clears the bar's line, is written, and the bar is drawn again
// under it, so that logs never cut into the bar.
type Terminal struct {
	mu  sync.Mutex
	out io.Writer
	bar []byte // the bar's line as last drawn
}

// NewTerminal shares out between a progress bar and logs.
func NewTerminal(out io.Writer) *Terminal { return &Terminal{out: out} }

// Write is the bar's output.
func (t *Terminal) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := bytes.LastIndexByte(b, '\r'); i >= 0 {
		t.bar = append(t.bar[:0], b[i:]...)
	} else {
		t.bar = append(t.bar, b...)
	}
	return t.out.Write(b)
}

// Log returns a writer for whole log lines that go to w (the same terminal as the bar's).
func (t *Terminal) Log(w io.Writer) io.Writer { return terminalLog{t: t, w: w} }

type terminalLog struct {
	t *Terminal
	w io.Writer
}

func (l terminalLog) Write(b []byte) (int, error) {
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	drawn := len(bytes.TrimSpace(t.bar)) > 0
	if drawn {
		_, _ = io.WriteString(t.out, "\r\033[K") // clear the bar's line
	}
	n, err := l.w.Write(b)
	if drawn {
		_, _ = t.out.Write(t.bar)
	}
	return n, err
}
