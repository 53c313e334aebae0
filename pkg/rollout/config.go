package rollout

import "github.com/drmas/drmas/pkg/choice"

// Config is the `rollout:` section: how far rollouts may run ahead of training. MaxStaleness K ≥ 1
// lets the engines generate the rollouts of the next K iterations while one trains (iteration j's
// rollout from weights version max(0, j−1−K)); 0 = rollout, then update.
type Config struct {
	MaxStaleness int `mapstructure:"max_staleness"`
}

// Validate checks the section, each problem naming its key under key ("rollout").
func (c Config) Validate(key string) error {
	var p choice.Problems
	p.IntIn(key+".max_staleness", c.MaxStaleness, 0, 16)
	return p.Err()
}

// source is the name of the source the section asks for (sources).
func (c Config) source() string {
	if c.MaxStaleness > 0 {
		return "ahead"
	}
	return "sync"
}
