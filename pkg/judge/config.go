package judge

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"text/template"
	"time"

	"github.com/drmas/drmas/pkg/netaddr"
)

// Reward types (reward.type).
const (
	TypeRule   = "rule"   // the orchestra's own checker (the default)
	TypeJudge  = "judge"  // an LLM judge
	TypeRemote = "remote" // a remote reward endpoint
)

// Judge modes (reward.judge.mode).
const (
	ModeJudge    = "judge"    // the judge scores every answered trajectory
	ModeFallback = "fallback" // the judge scores only the answers the rule checker cannot decide
)

// What a failure does (on_error).
const (
	OnErrorFail  = "fail"  // the rollout, and so the iteration, fails with the named error
	OnErrorScore = "score" // the trajectory gets error_score and the failure is counted
)

// Config is the `reward:` section of a run config.
type Config struct {
	// Type is rule (default), judge or remote.
	Type string `mapstructure:"type"`
	// SuccessThreshold: a trajectory whose judged or remote reward is ≥ it counts as solved
	// (avg@k, pass@k). Default 1.
	SuccessThreshold float64      `mapstructure:"success_threshold"`
	Judge            JudgeConfig  `mapstructure:"judge"`
	Remote           RemoteConfig `mapstructure:"remote"`
}

// Endpoint holds the settings every HTTP reward shares.
type Endpoint struct {
	// URL: the judge's base URL (http://host:port or …/v1; /v1/chat/completions is appended unless the
	// URL already ends with it) or the remote endpoint's full URL.
	URL string `mapstructure:"url"`
	// APIKeyEnv names the environment variable holding the key, sent as "Authorization: Bearer <key>";
	// "" = no key. The key itself never goes in a config file.
	APIKeyEnv      string        `mapstructure:"api_key_env"`
	MaxConcurrency int           `mapstructure:"max_concurrency"` // requests in flight at most
	Timeout        time.Duration `mapstructure:"timeout"`         // per attempt
	Retries        int           `mapstructure:"retries"`         // further attempts after a transport error, a timeout, a 429 or a 5xx
	// OnError is what a request that still fails does: fail (default) or score (error_score, counted).
	OnError    string  `mapstructure:"on_error"`
	ErrorScore float64 `mapstructure:"error_score"`
}

// JudgeConfig is `reward.judge`: the judge model, its prompt and how its reply is read.
type JudgeConfig struct {
	Endpoint `mapstructure:",squash"`
	// Model is the request's "model" ("" = the server's default: drmas serve's model).
	Model string `mapstructure:"model"`
	// Mode is judge (default) or fallback.
	Mode string `mapstructure:"mode"`
	// System, when set, is a system message before the prompt.
	System string `mapstructure:"system"`
	// Prompt is a Go text/template over .Question, .Answer, .Reference (the gold answers joined with
	// " | ") and .References (the list).
	Prompt string `mapstructure:"prompt"`
	// Pattern is a regular expression with one capture group; its last match in the reply (after any
	// </think>) is the verdict or the score.
	Pattern string `mapstructure:"pattern"`
	// Verdicts map verdict words (case-insensitive) to scores; empty: the capture is a number in [0, 1].
	Verdicts    map[string]float64 `mapstructure:"verdicts"`
	Temperature float64            `mapstructure:"temperature"`
	MaxTokens   int                `mapstructure:"max_tokens"`
	// CacheEntries bounds the judgement cache (distinct inputs kept for the whole run).
	CacheEntries int `mapstructure:"cache_entries"`
}

// RemoteConfig is `reward.remote`: the endpoint that scores trajectories.
type RemoteConfig struct {
	Endpoint `mapstructure:",squash"`
	// BatchSize is the trajectories per POST (1 = one POST per trajectory).
	BatchSize int `mapstructure:"batch_size"`
}

// DefaultPrompt asks for a verdict in tags, which DefaultPattern and DefaultVerdicts read.
const DefaultPrompt = `You are grading an answer to a question against the reference answer.

Question: {{.Question}}
Reference answer: {{.Reference}}
Answer to grade: {{.Answer}}

Is the answer to grade correct, i.e. equivalent to the reference answer? Think briefly, then end your
reply with <verdict>correct</verdict> or <verdict>incorrect</verdict>.`

// DefaultPattern captures the word inside <verdict>…</verdict>.
const DefaultPattern = `(?is)<verdict>\s*([^<]*?)\s*</verdict>`

// DefaultVerdicts maps DefaultPrompt's verdicts to scores.
func DefaultVerdicts() map[string]float64 { return map[string]float64{"correct": 1, "incorrect": 0} }

// Defaults returns the section that YAML is decoded over. Verdicts is left empty and filled by
// Resolve when the pattern is the default, so that a config's own map replaces it whole.
func Defaults() Config {
	ep := Endpoint{MaxConcurrency: 8, Timeout: 60 * time.Second, Retries: 2, OnError: OnErrorFail}
	return Config{Type: TypeRule, SuccessThreshold: 1,
		Judge: JudgeConfig{Endpoint: ep, Mode: ModeJudge, Prompt: DefaultPrompt, Pattern: DefaultPattern,
			Temperature: 0, MaxTokens: 512, CacheEntries: 1 << 16},
		Remote: RemoteConfig{Endpoint: ep, BatchSize: 32}}
}

// Resolve fills what Defaults leaves to the config: the default verdicts under the default pattern.
func (c Config) Resolve() Config {
	if len(c.Judge.Verdicts) == 0 && c.Judge.Pattern == DefaultPattern {
		c.Judge.Verdicts = DefaultVerdicts()
	}
	return c
}

// Validate checks the section, each problem naming its key (reward.judge.url, …).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("reward.%s: "+format, append([]any{key}, args...)...))
	}
	switch c.Type {
	case TypeRule, TypeJudge, TypeRemote:
	default:
		bad("type", "must be one of %s, %s, %s (got %q)", TypeRule, TypeJudge, TypeRemote, c.Type)
	}
	if math.IsNaN(c.SuccessThreshold) || math.IsInf(c.SuccessThreshold, 0) {
		bad("success_threshold", "must be a finite number (got %g)", c.SuccessThreshold)
	}
	if c.Type == TypeJudge {
		j := c.Judge
		j.Endpoint.validate("judge", bad)
		if j.Mode != ModeJudge && j.Mode != ModeFallback {
			bad("judge.mode", "must be %s or %s (got %q)", ModeJudge, ModeFallback, j.Mode)
		}
		if strings.TrimSpace(j.Prompt) == "" {
			bad("judge.prompt", "required (a text/template over .Question, .Answer, .Reference)")
		} else if _, err := parsePrompt(j.Prompt); err != nil {
			bad("judge.prompt", "%v", err)
		}
		if re, err := regexp.Compile(j.Pattern); err != nil {
			bad("judge.pattern", "not a regular expression: %v", err)
		} else if re.NumSubexp() < 1 {
			bad("judge.pattern", "%q has no capture group: the verdict or the score is the first group", j.Pattern)
		}
		for w, s := range c.Resolve().Judge.Verdicts {
			if strings.TrimSpace(w) == "" {
				bad("judge.verdicts", "an empty verdict word")
			}
			if !(s >= 0 && s <= 1) {
				bad("judge.verdicts."+w, "must be a score in [0, 1] (got %g)", s)
			}
		}
		if !(j.Temperature >= 0) || math.IsInf(j.Temperature, 0) {
			bad("judge.temperature", "must be a finite number ≥ 0 (got %g)", j.Temperature)
		}
		if j.MaxTokens < 1 {
			bad("judge.max_tokens", "must be ≥ 1 (got %d)", j.MaxTokens)
		}
		if j.CacheEntries < 0 {
			bad("judge.cache_entries", "must be ≥ 0, 0 = no cache (got %d)", j.CacheEntries)
		}
		if j.OnError == OnErrorScore && !(j.ErrorScore >= 0 && j.ErrorScore <= 1) {
			bad("judge.error_score", "must be in [0, 1] like the judge's scores (got %g)", j.ErrorScore)
		}
	}
	if c.Type == TypeRemote {
		c.Remote.Endpoint.validate("remote", bad)
		if c.Remote.BatchSize < 1 {
			bad("remote.batch_size", "must be ≥ 1 (got %d)", c.Remote.BatchSize)
		}
		if s := c.Remote.ErrorScore; math.IsNaN(s) || math.IsInf(s, 0) {
			bad("remote.error_score", "must be a finite number (got %g)", s)
		}
	}
	return errors.Join(errs...)
}

func (e Endpoint) validate(sec string, bad func(key, format string, args ...any)) {
	if e.URL == "" {
		bad(sec+".url", "required")
	} else if err := checkURL(e.URL); err != nil {
		bad(sec+".url", "%v", err)
	}
	if e.APIKeyEnv != "" && !envName.MatchString(e.APIKeyEnv) {
		bad(sec+".api_key_env", "%q is not an environment variable name (the key itself never goes in the config)", e.APIKeyEnv)
	}
	if e.MaxConcurrency < 1 {
		bad(sec+".max_concurrency", "must be ≥ 1 (got %d)", e.MaxConcurrency)
	}
	if e.Timeout <= 0 || e.Timeout > time.Hour {
		bad(sec+".timeout", "must be in (0s, 1h] (got %s)", e.Timeout)
	}
	if e.Retries < 0 || e.Retries > 100 {
		bad(sec+".retries", "must be in [0, 100] (got %d)", e.Retries)
	}
	if e.OnError != OnErrorFail && e.OnError != OnErrorScore {
		bad(sec+".on_error", "must be %s or %s (got %q)", OnErrorFail, OnErrorScore, e.OnError)
	}
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func checkURL(u string) error {
	return netaddr.CheckHTTP(u, "http://127.0.0.1:30000")
}

// parsePrompt parses a judge prompt template; a template naming a field the data lacks fails here.
func parsePrompt(s string) (*template.Template, error) {
	t, err := template.New("judge.prompt").Option("missingkey=error").Parse(s)
	if err != nil {
		return nil, err
	}
	if err := t.Execute(discard{}, PromptData{Question: "q", Answer: "a", Reference: "r", References: []string{"r"}}); err != nil {
		return nil, err
	}
	return t, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
