package tool

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/drmas/drmas/pkg/netaddr"
)

// Defaults for Settings' zero values.
const (
	DefaultMaxResultChars = 4000
	DefaultTimeout        = 30 * time.Second
	DefaultConcurrency    = 8
	DefaultRetries        = 3
)

// Settings bound tool calls. Zero values take the defaults.
type Settings struct {
	// MaxResultChars bounds a result's text in characters (runes); a longer one is cut and marked.
	MaxResultChars int `json:"max_result_chars" mapstructure:"max_result_chars"`
	// Timeout bounds a call, all its tries together (a server's own timeout overrides it for its tools).
	Timeout time.Duration `json:"timeout" mapstructure:"timeout"`
	// Concurrency is how many calls run at once, across all tools; more wait for a slot.
	Concurrency int `json:"concurrency" mapstructure:"concurrency"`
	// Retries is how many times a call is tried in all when the tool cannot be reached (transport
	// failures, a server restarted); 1 means a single try. A tool's own errors are never tried again.
	Retries int `json:"retries" mapstructure:"retries"`
}

// withDefaults fills in the zero fields.
func (s Settings) withDefaults() Settings {
	s.MaxResultChars = cmp.Or(s.MaxResultChars, DefaultMaxResultChars)
	s.Timeout = cmp.Or(s.Timeout, DefaultTimeout)
	s.Concurrency = cmp.Or(s.Concurrency, DefaultConcurrency)
	s.Retries = cmp.Or(s.Retries, DefaultRetries)
	return s
}

// Server declares an MCP server: a stdio one drmas starts (Command, Args, Env) or a streamable-HTTP
// one it connects to (URL, KeyEnv).
type Server struct {
	// Name names the server in errors and logs.
	Name string `json:"name" mapstructure:"name"`
	// Command and Args start a stdio server. Its environment is Env over a safe default set of
	// drmas's variables (HOME, LOGNAME, PATH, SHELL, TERM, USER and the locale: inheritEnv), never the
	// rest of drmas's environment (keys, credentials).
	Command string            `json:"command" mapstructure:"command"`
	Args    []string          `json:"args" mapstructure:"args"`
	Env     map[string]string `json:"env" mapstructure:"env"`
	// URL is a streamable-HTTP server's endpoint (e.g. http://127.0.0.1:3001/mcp).
	URL string `json:"url" mapstructure:"url"`
	// KeyEnv names the environment variable holding the HTTP server's key, sent as
	// "Authorization: Bearer <key>"; empty means no key.
	KeyEnv string `json:"key_env" mapstructure:"key_env"`
	// Timeout bounds each call to this server's tools; 0 means the settings' timeout.
	Timeout time.Duration `json:"timeout" mapstructure:"timeout"`
	// Tools names the server's tools to offer; each must be among those it lists at start-up. Empty
	// means all it lists.
	Tools []string `json:"tools" mapstructure:"tools"`
}

// Config is the tools section of a run config: the settings and the MCP servers.
type Config struct {
	Settings `mapstructure:",squash"`
	Servers  []Server `json:"mcp_servers" mapstructure:"mcp_servers"`
}

// serverName is what a server's name may be.
var serverName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// Validate checks the config; each problem names its key under prefix (e.g. "tools").
func (c Config) Validate(prefix string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{join(prefix, key)}, args...)...))
	}
	if c.MaxResultChars < 0 {
		bad("max_result_chars", "must be ≥ 0 (got %d; 0 means %d)", c.MaxResultChars, DefaultMaxResultChars)
	}
	if c.Timeout < 0 {
		bad("timeout", "must be ≥ 0 (got %v; 0 means %v)", c.Timeout, DefaultTimeout)
	}
	if c.Concurrency < 0 {
		bad("concurrency", "must be ≥ 0 (got %d; 0 means %d)", c.Concurrency, DefaultConcurrency)
	}
	if c.Retries < 0 {
		bad("retries", "must be ≥ 0 (got %d; 0 means %d)", c.Retries, DefaultRetries)
	}
	seen := map[string]int{}
	for i, s := range c.Servers {
		key := fmt.Sprintf("mcp_servers[%d]", i)
		if s.Name != "" {
			key = fmt.Sprintf("mcp_servers[%d] (%s)", i, s.Name)
		}
		sbad := func(field, format string, args ...any) { bad(key+"."+field, format, args...) }
		switch {
		case s.Name == "":
			sbad("name", "required")
		case !serverName.MatchString(s.Name):
			sbad("name", "%q: want 1–64 letters, digits, '_', '-' or '.'", s.Name)
		default:
			if j, dup := seen[s.Name]; dup {
				sbad("name", "%q is also mcp_servers[%d]'s name", s.Name, j)
			}
			seen[s.Name] = i
		}
		switch {
		case s.Command == "" && s.URL == "":
			sbad("command", "a server needs a command (stdio) or a url (streamable HTTP)")
		case s.Command != "" && s.URL != "":
			sbad("url", "give a command (stdio) or a url (streamable HTTP), not both")
		case s.URL != "":
			if err := checkURL(s.URL); err != nil {
				sbad("url", "%v", err)
			}
			if len(s.Args) > 0 {
				sbad("args", "only a stdio server (command) takes args")
			}
			if len(s.Env) > 0 {
				sbad("env", "only a stdio server (command) takes env; an HTTP server's key goes in key_env")
			}
		default:
			if s.KeyEnv != "" {
				sbad("key_env", "only an HTTP server (url) takes a key")
			}
		}
		if s.Timeout < 0 {
			sbad("timeout", "must be ≥ 0 (got %v; 0 means the tools' timeout)", s.Timeout)
		}
		names := map[string]bool{}
		for _, t := range s.Tools {
			if err := CheckName(t); err != nil {
				sbad("tools", "%v", err)
			} else if names[t] {
				sbad("tools", "%q named twice", t)
			}
			names[t] = true
		}
	}
	return errors.Join(errs...)
}

// checkURL reports whether u can be a streamable-HTTP server's endpoint: http or https with a host.
func checkURL(u string) error {
	return netaddr.CheckHTTP(u, "http://127.0.0.1:3001/mcp")
}

// join is prefix.key, or key alone without a prefix.
func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}
