package train

// Metrics is one iteration's figures as the loop gathers them (keys: pkg/metric, docs/contracts.md);
// the reporter writes them as a metric.Row.
type Metrics map[string]float64
