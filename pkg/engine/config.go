package engine

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/replica"
)

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
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			ck.Bad(fmt.Sprintf("%s.urls[%d]", key, i), "%q is not an http(s)://host:port URL", u)
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
