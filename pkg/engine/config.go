package engine

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/netaddr"
	"github.com/drmas/drmas/pkg/replica"
)

// Config is one model's `models[].rollout` section: where its rollouts are sampled — in-process
// (local) or on serving-engine replicas drmas keeps in sync with the trained weights — which
// replicas, and how patient to be. A Client reads the protocol and replica fields; the fleet
// (fleet.go) the rest.
type Config struct {
	Engine      string        `mapstructure:"engine"`       // local | sglang | vllm | openai | managed
	URLs        []string      `mapstructure:"urls"`         // replica base URLs (http://host:port); several = load-balanced
	MaxInflight int           `mapstructure:"max_inflight"` // requests in flight per replica (≥ 1)
	Timeout     time.Duration `mapstructure:"timeout"`      // per request attempt (and per weight reload)
	Retries     int           `mapstructure:"retries"`      // further attempts, on the other replicas first, with backoff
	// MaxLogprobDiff bounds a replica's mean |served − trainer| log-prob per sampled token in an
	// iteration (rows at temperature 1): beyond it the iteration fails naming the replica instead of
	// training on tokens the trained weights did not sample (a replica on stale weights). 0 = off.
	MaxLogprobDiff float64 `mapstructure:"max_logprob_diff"`
	// APIKey is sent to every replica as "Authorization: Bearer <key>" (drmas serve --api-key, vLLM's,
	// SGLang's); "" = the environment variable DRMAS_API_KEY, if set.
	APIKey string `mapstructure:"api_key"`
	// Managed replicas (engine: managed): how many drmas serve processes drmas train starts for the
	// model, each on the next of Devices (cycled; empty: the model's device) with Threads libtorch
	// threads (0: one per core), pinned to the next of CPUs (cycled; a CPU list as taskset writes it,
	// "1", "2-3"; empty: not pinned).
	Replicas int      `mapstructure:"replicas"`
	Devices  []string `mapstructure:"devices"`
	Threads  int      `mapstructure:"threads"`
	CPUs     []string `mapstructure:"cpus"`
	// MaxBatch and KVTokens bound engine local's generation (continuous batching): rows in flight
	// and KV-cache positions (rows × cache columns); 0 = no bound (every request of a turn at once).
	MaxBatch int   `mapstructure:"max_batch"`
	KVTokens int64 `mapstructure:"kv_tokens"`
}

// DefaultMaxLogprobDiff is max_logprob_diff's default, in nats: with the weights in sync, drmas
// serve's mean gap per token measured 0 in float64, under 1e-6 in float32 and 1.4e-4 in bfloat16
// (largest single token 1.0e-3) on the toy model (cmd/drmas/engines_test.go), and production engines
// add kernel differences of the order of 1e-2; an engine sampling tokens the weights did not choose
// shows gaps of nats (5.8 measured). 0.1 leaves a margin of ~700× over bfloat16.
const DefaultMaxLogprobDiff = 0.1

// Defaults is the section each model's `rollout:` is decoded over.
func Defaults() Config {
	return Config{Engine: Local, MaxInflight: 32, Timeout: 5 * time.Minute, Retries: 3, MaxLogprobDiff: DefaultMaxLogprobDiff, Replicas: 1}
}

// Served says whether the model's rollouts run on serving engines (any engine but local).
func (c Config) Served() bool { return c.Engine != "" && c.Engine != Local }

// deviceRE is a device a managed replica may be started on.
var deviceRE = regexp.MustCompile(`^(|auto|cpu|cuda|cuda:\d+)$`)

// Validate checks the section, each problem naming its key under key ("models[0].rollout").
func (r Config) Validate(key string) error {
	var ck choice.Problems
	ck.Registered(key+".engine", r.Engine, Kinds)
	ck.NonNeg(key+".max_logprob_diff", r.MaxLogprobDiff)
	ck.AtLeast(key+".max_batch", r.MaxBatch, 0)
	ck.NonNeg(key+".kv_tokens", float64(r.KVTokens))
	if strings.ContainsFunc(r.APIKey, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		ck.Bad(key+".api_key", "must not hold spaces or control characters (it is sent as an HTTP header)")
	}
	if r.Engine == Local {
		if len(r.URLs) > 0 {
			ck.Bad(key+".urls", "engine local samples in-process and takes no urls (set engine: sglang, vllm, openai or managed)")
		}
		if r.APIKey != "" {
			ck.Bad(key+".api_key", "engine local samples in-process and takes no api_key")
		}
		return ck.Err()
	}
	if len(r.CPUs) > 0 && r.Engine != Managed {
		ck.Bad(key+".cpus", "pins managed replicas (engine: managed) only")
	}
	if r.Engine == Managed {
		if len(r.URLs) > 0 || r.APIKey != "" {
			ck.Bad(key+".urls", "engine managed starts its own replicas on loopback with their own key: no urls or api_key")
		}
		ck.IntIn(key+".replicas", r.Replicas, 1, 64)
		ck.AtLeast(key+".threads", r.Threads, 0)
		for i, d := range r.Devices {
			if !deviceRE.MatchString(d) {
				ck.Bad(fmt.Sprintf("%s.devices[%d]", key, i), "%q: want cpu, cuda or cuda:N", d)
			}
		}
		for i, c := range r.CPUs {
			if err := replica.CheckCPUs(c); err != nil {
				ck.Bad(fmt.Sprintf("%s.cpus[%d]", key, i), "%v", err)
			}
		}
	} else if len(r.URLs) == 0 {
		ck.Bad(key+".urls", "engine %s needs at least one replica URL (http://host:port)", r.Engine)
	}
	seen := map[string]int{}
	for i, u := range r.URLs {
		if err := netaddr.CheckHTTP(u, "http://127.0.0.1:30000"); err != nil {
			ck.Bad(fmt.Sprintf("%s.urls[%d]", key, i), "%v", err)
		} else if j, dup := seen[u]; dup {
			ck.Bad(fmt.Sprintf("%s.urls[%d]", key, i), "%q repeats urls[%d]", u, j)
		}
		seen[u] = i
	}
	ck.AtLeast(key+".max_inflight", r.MaxInflight, 1)
	if r.Timeout <= 0 {
		ck.Bad(key+".timeout", "must be > 0, e.g. 5m (got %s)", r.Timeout)
	}
	ck.AtLeast(key+".retries", r.Retries, 0)
	return ck.Err()
}

// OuterLoRAVaries says whether the engine's support of LoRA on embed_tokens and lm_head varies by
// version (vLLM has refused it for Qwen2/Qwen3; SGLang's differs by release); drmas serve has it.
func (r Config) OuterLoRAVaries() bool { return r.Engine == VLLM || r.Engine == SGLang }
