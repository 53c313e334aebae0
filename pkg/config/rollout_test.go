package config

import (
	"strings"
	"testing"
	"time"
)

func TestRolloutDefaultsAndKeys(t *testing.T) {
	c, err := Load(write(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Models[0].Rollout; r.Engine != "local" || len(r.URLs) != 0 || r.MaxInflight != 32 || r.Timeout != 5*time.Minute || r.Retries != 3 || r.MaxLogprobDiff != 0.1 {
		t.Fatalf("defaults %+v", r)
	}
	c, err = Load(write(t, minimal), []string{`models.0.rollout={max_batch: 16, kv_tokens: 65536}`})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Models[0].Rollout; r.Engine != "local" || r.MaxBatch != 16 || r.KVTokens != 65536 {
		t.Fatalf("local bounds %+v", r)
	}
	c, err = Load(write(t, minimal), []string{`models.0.rollout={engine: sglang, urls: [http://10.0.0.5:30000, http://10.0.0.6:30000], max_inflight: 8, timeout: 90s, retries: 1, max_logprob_diff: 0.5}`})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Models[0].Rollout; r.Engine != "sglang" || len(r.URLs) != 2 || r.MaxInflight != 8 || r.Timeout != 90*time.Second || r.Retries != 1 || r.MaxLogprobDiff != 0.5 {
		t.Fatalf("rollout %+v", r)
	}
}

func TestRolloutValidation(t *testing.T) {
	for set, want := range map[string]string{
		`models.0.rollout={engine: tgi, urls: [http://h:1]}`:                          `models[0].rollout.engine: must be one of local, sglang, vllm, openai, managed (got "tgi")`,
		`models.0.rollout={engine: vllm}`:                                             "models[0].rollout.urls: engine vllm needs at least one replica URL",
		`models.0.rollout={engine: openai, urls: ["10.0.0.5:8000"]}`:                  `models[0].rollout.urls[0]: "10.0.0.5:8000" is not an http(s) URL with a host (e.g. http://127.0.0.1:30000)`,
		`models.0.rollout={engine: sglang, urls: [http://h:1, http://h:1]}`:           `models[0].rollout.urls[1]: "http://h:1" repeats urls[0]`,
		`models.0.rollout={engine: local, urls: [http://h:1]}`:                        "models[0].rollout.urls: engine local samples in-process",
		`models.0.rollout={engine: sglang, urls: [http://h:1], max_inflight: 0}`:      "models[0].rollout.max_inflight: must be ≥ 1",
		`models.0.rollout={engine: sglang, urls: [http://h:1], retries: -1}`:          "models[0].rollout.retries: must be ≥ 0",
		`models.0.rollout={engine: sglang, urls: [http://h:1], timeout: 0s}`:          "models[0].rollout.timeout: must be > 0",
		`models.0.rollout={engine: sglang, url: http://h:1}`:                          "url",
		`models.0.rollout={engine: sglang, urls: [http://h:1], max_logprob_diff: -1}`: "models[0].rollout.max_logprob_diff: must be a finite number ≥ 0 (got -1)",
		`models.0.rollout.max_logprob_diff=.inf`:                                      "models[0].rollout.max_logprob_diff: must be a finite number",
		`models.0.rollout={engine: local, api_key: k}`:                                "models[0].rollout.api_key: engine local samples in-process and takes no api_key",
		`models.0.rollout={engine: sglang, urls: [http://h:1], api_key: "a b"}`:       "models[0].rollout.api_key: must not hold spaces or control characters",
		`models.0.rollout.max_batch=-1`:                                               "models[0].rollout.max_batch: must be ≥ 0",
		`models.0.rollout.kv_tokens=-5`:                                               "models[0].rollout.kv_tokens: must be a finite number ≥ 0",
	} {
		_, err := Load(write(t, minimal), []string{set})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: err = %v, want it to contain %q", set, err, want)
		}
	}
}
