package serve

import (
	"fmt"
	"strings"
	"testing"
)

// Sampling settings the sampler does not implement are refused with 400 naming them, on both
// OpenAI endpoints and SGLang's /generate (before: 200 with the output unchanged; response_format,
// regex, json_schema and vLLM's guided decoding were still ignored so, until #52); each one's default
// is accepted.
func TestUnimplementedSamplingParamsRefused(t *testing.T) {
	_, hs := toyServer(t, Options{})
	set := []struct {
		name string
		v    any
	}{
		{"logit_bias", map[string]float64{"60": 100}},
		{"presence_penalty", 1.5},
		{"frequency_penalty", -0.5},
		{"repetition_penalty", 1.2},
		{"min_p", 0.1},
		{"min_tokens", 4},
		{"min_new_tokens", 4},
		{"ignore_eos", true},
		{"best_of", 3},
		{"response_format", map[string]any{"type": "json_object"}},
		{"regex", "[0-9]+"},
		{"json_schema", `{"type": "object"}`},
		{"ebnf", `root ::= "a"`},
		{"guided_json", map[string]any{"type": "object"}},
		{"guided_regex", "[0-9]+"},
		{"guided_choice", []string{"a", "b"}},
		{"guided_grammar", `root ::= "a"`},
		{"structured_outputs", map[string]any{"regex": "a"}},
	}
	defaults := map[string]any{"logit_bias": map[string]float64{}, "presence_penalty": 0, "frequency_penalty": 0,
		"repetition_penalty": 1, "min_p": 0, "min_tokens": 0, "min_new_tokens": 0, "ignore_eos": false, "best_of": 2,
		"response_format": map[string]any{"type": "text"}, "regex": nil, "json_schema": nil, "guided_json": nil}
	type endpoint struct {
		path   string
		body   func(extra map[string]any) map[string]any
		prefix string
	}
	eps := []endpoint{
		{"/v1/completions", func(extra map[string]any) map[string]any {
			b := map[string]any{"prompt": "ab", "max_tokens": 2, "n": 2}
			for k, v := range extra {
				b[k] = v
			}
			return b
		}, ""},
		{"/v1/chat/completions", func(extra map[string]any) map[string]any {
			b := map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 2, "n": 2}
			for k, v := range extra {
				b[k] = v
			}
			return b
		}, ""},
		{"/generate", func(extra map[string]any) map[string]any {
			sp := map[string]any{"max_new_tokens": 2}
			for k, v := range extra {
				if k == "best_of" && v == 2 {
					v = 1 // /generate returns one completion
				}
				sp[k] = v
			}
			return map[string]any{"input_ids": []int{60, 97}, "sampling_params": sp}
		}, "sampling_params."},
	}
	for _, ep := range eps {
		for _, p := range set {
			code, r := call(t, hs.URL+ep.path, "", ep.body(map[string]any{p.name: p.v}))
			e, _ := r["error"].(map[string]any)
			if code != 400 || e == nil || e["param"] != ep.prefix+p.name || !strings.Contains(fmt.Sprint(e["message"]), p.name) {
				t.Errorf("%s with %s %v: HTTP %d %v, want 400 naming %s%s", ep.path, p.name, p.v, code, r, ep.prefix, p.name)
			}
		}
		if code, r := call(t, hs.URL+ep.path, "", ep.body(defaults)); code != 200 {
			t.Errorf("%s with every setting at its default: HTTP %d %v, want 200", ep.path, code, r)
		}
	}
}

// Sampling settings out of their range are refused with 400 naming them (before: top_k -5 was taken
// as "off"); vLLM's and SGLang's -1 for top_k stays "off".
func TestSamplingRangesRefused(t *testing.T) {
	_, hs := toyServer(t, Options{})
	for _, c := range []struct {
		name string
		v    any
	}{{"top_k", -5}, {"top_k", -2}, {"top_p", 1.5}, {"top_p", -0.1}, {"temperature", -1}, {"max_tokens", 0}} {
		code, r := call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": "ab", "max_tokens": 2, c.name: c.v})
		e, _ := r["error"].(map[string]any)
		if code != 400 || e == nil || !strings.Contains(fmt.Sprint(e["message"]), strings.TrimSuffix(c.name, "s")) {
			t.Errorf("%s %v: HTTP %d %v, want 400 naming it", c.name, c.v, code, r)
		}
		sp := map[string]any{"max_new_tokens": 2, c.name: c.v}
		if c.name == "max_tokens" {
			sp = map[string]any{"max_new_tokens": c.v}
		}
		code, r = call(t, hs.URL+"/generate", "", map[string]any{"input_ids": []int{60, 97}, "sampling_params": sp})
		if code != 400 {
			t.Errorf("/generate with %s %v: HTTP %d %v, want 400", c.name, c.v, code, r)
		}
	}
	for _, k := range []int{-1, 0, 5} {
		if code, r := call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": "ab", "max_tokens": 2, "top_k": k}); code != 200 {
			t.Errorf("top_k %d: HTTP %d %v, want 200", k, code, r)
		}
	}
}
