package gateway

import (
	"sync"
	"time"

	"github.com/drmas/drmas/pkg/metric"
)

// Where a gateway rollout's wall time goes, for the time/gateway/* metrics: the wall time during which
// some call of the rollout was generating, the time the endpoint was serving some call without any
// generating (reading the request, answering it), and the rest, when no call was in the endpoint at
// all: the runner's own code and its HTTP round trips (drmas cannot see inside them).

// Metric keys of the split (seconds of the rollout's wall time; they add up to it).
const (
	MetricTimeGeneration = metric.TimeGatewayGeneration
	MetricTimeHTTP       = metric.TimeGatewayHTTP
	MetricTimeRunner     = metric.TimeGatewayRunner
)

// busy measures the wall time during which at least one of some concurrent activities was under way.
type busy struct {
	mu    sync.Mutex
	n     int
	since time.Time
	total time.Duration
}

// enter starts one activity.
func (b *busy) enter() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		b.since = time.Now()
	}
	b.n++
}

// leave ends one activity.
func (b *busy) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	if b.n == 0 {
		b.total += time.Since(b.since)
	}
}

// elapsed is the busy time so far.
func (b *busy) elapsed() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.total
	if b.n > 0 {
		t += time.Since(b.since)
	}
	return t
}

// clock is one rollout's: its calls' generation and their time in the endpoint.
type clock struct {
	began      time.Time
	gen, serve busy
}

func newClock() *clock { return &clock{began: time.Now()} }

// split is the rollout's wall time so far in seconds, as the time/gateway/* metrics.
func (c *clock) split() map[string]float64 {
	wall, serve, gen := time.Since(c.began), c.serve.elapsed(), c.gen.elapsed()
	return map[string]float64{MetricTimeGeneration: gen.Seconds(), MetricTimeHTTP: max(serve-gen, 0).Seconds(),
		MetricTimeRunner: max(wall-serve, 0).Seconds()}
}
