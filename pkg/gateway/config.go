package gateway

import (
	"cmp"
	"fmt"
	"time"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/netaddr"
)

// Config is a gateway orchestra's `orchestra.runner:` section: the program that plays the episodes
// (an HTTP server answering POST <url>/run), whether drmas starts it, and how patient to be.
type Config struct {
	// URL is the runner's base URL: drmas POSTs each episode to <url>/run.
	URL string `mapstructure:"url"`
	// Command and Args start the runner (drmas waits until url answers, restarts it if it dies and
	// stops it at the end); empty: the runner is started by someone else. Env adds to the
	// environment it inherits.
	Command string            `mapstructure:"command"`
	Args    []string          `mapstructure:"args"`
	Env     map[string]string `mapstructure:"env"`
	// Timeout bounds one episode: the runner's answer to one POST /run.
	Timeout time.Duration `mapstructure:"timeout"`
	// Concurrency is how many episodes run at once.
	Concurrency int `mapstructure:"concurrency"`
	// Attempts is how many times an episode is played before it counts as failed (a runner that
	// answered 5xx, an unreadable answer, a timeout).
	Attempts int `mapstructure:"attempts"`
	// StartTimeout bounds the wait for a runner drmas started to answer.
	StartTimeout time.Duration `mapstructure:"start_timeout"`
}

// Defaults for a Config's zero fields.
const (
	DefaultTimeout      = 10 * time.Minute
	DefaultConcurrency  = 64
	DefaultAttempts     = 2
	DefaultStartTimeout = time.Minute
)

// withDefaults fills in the zero fields.
func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.Attempts = cmp.Or(c.Attempts, DefaultAttempts)
	c.StartTimeout = cmp.Or(c.StartTimeout, DefaultStartTimeout)
	return c
}

// Validate checks the section, each problem naming its key under key ("orchestra.runner").
func (c Config) Validate(key string) error {
	var p choice.Problems
	if netaddr.CheckHTTP(c.URL, "http://127.0.0.1:8000") != nil { // its own message below says what the URL is for
		p.Bad(key+".url", "want the runner's base URL, http(s)://host:port (drmas POSTs each episode to <url>/run); got %q", c.URL)
	}
	if c.Timeout < 0 || c.Timeout > 24*time.Hour {
		p.Bad(key+".timeout", "must be in [0s, 24h], 0 = %s (got %s)", DefaultTimeout, c.Timeout)
	}
	if c.StartTimeout < 0 || c.StartTimeout > time.Hour {
		p.Bad(key+".start_timeout", "must be in [0s, 1h], 0 = %s (got %s)", DefaultStartTimeout, c.StartTimeout)
	}
	p.IntIn(key+".concurrency", c.Concurrency, 0, 4096)
	p.IntIn(key+".attempts", c.Attempts, 0, 16)
	if c.Command == "" && (len(c.Args) > 0 || len(c.Env) > 0) {
		p.Bad(key+".command", "args and env start a runner: name its command too (or remove them for a runner you start)")
	}
	return p.Err()
}

// String names the runner in logs and errors.
func (c Config) String() string {
	if c.Command != "" {
		return fmt.Sprintf("%s (started: %s)", c.URL, c.Command)
	}
	return c.URL
}
