package serve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
)

// call sends body (nil: GET) to url with the key (if any) and decodes the JSON reply.
func call(t *testing.T, url, key string, body any) (int, map[string]any) {
	t.Helper()
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		b, _ := json.Marshal(body)
		method, rd = http.MethodPost, bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s: HTTP %d, not JSON: %q", url, resp.StatusCode, data)
		}
	}
	return resp.StatusCode, out
}

// events posts body and reads the server-sent events of the reply: the JSON ones, and whether
// "data: [DONE]" ended the stream.
func events(t *testing.T, url string, body any) ([]map[string]any, bool) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: HTTP %d %s: %s", url, resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	var out []map[string]any
	done := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if done {
			t.Fatalf("event after [DONE]: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		out = append(out, m)
	}
	return out, done
}

func choices(m map[string]any) []map[string]any {
	var out []map[string]any
	for _, c := range m["choices"].([]any) {
		out = append(out, c.(map[string]any))
	}
	return out
}

func num(v any) int { return int(v.(float64)) }

// isError says whether m is OpenAI's error shape with a message.
func isError(m map[string]any) bool {
	e, ok := m["error"].(map[string]any)
	if !ok {
		return false
	}
	msg, _ := e["message"].(string)
	_, typ := e["type"].(string)
	_, param := e["param"]
	_, code := e["code"]
	return msg != "" && typ && param && code
}

var chatMsgs = []map[string]string{{"role": "user", "content": "2+3?"}}

// A streamed chat, completion and /generate deliver, chunk by chunk, exactly the text of the same
// request answered in one reply (stop strings held back until they can be told apart), open with
// the assistant role, close with finish_reason, a usage chunk when asked, and "data: [DONE]".
func TestStreamingMatchesOneReply(t *testing.T) {
	_, hs := toyServer(t, Options{})
	for seed := 0; seed < 4; seed++ {
		body := map[string]any{"messages": chatMsgs, "max_tokens": 24, "seed": seed, "temperature": 1}
		if seed%2 == 1 {
			body["stop"] = []string{"e", "ab"}
		}
		code, one := call(t, hs.URL+"/v1/chat/completions", "", body)
		if code != 200 {
			t.Fatalf("chat: %d %v", code, one)
		}
		want := choices(one)[0]
		body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
		evs, done := events(t, hs.URL+"/v1/chat/completions", body)
		if !done || len(evs) < 3 {
			t.Fatalf("chat stream: %d events, [DONE] %v", len(evs), done)
		}
		if d := choices(evs[0])[0]["delta"].(map[string]any); d["role"] != "assistant" {
			t.Errorf("first chunk %v: no assistant role", evs[0])
		}
		var text strings.Builder
		finish := ""
		for _, e := range evs[:len(evs)-1] {
			if e["object"] != "chat.completion.chunk" || e["usage"] != nil {
				t.Errorf("chunk %v: want object chat.completion.chunk, usage null", e)
			}
			c := choices(e)[0]
			if s, ok := c["delta"].(map[string]any)["content"].(string); ok {
				text.WriteString(s)
			}
			if f, ok := c["finish_reason"].(string); ok {
				finish = f
			}
		}
		if text.String() != want["message"].(map[string]any)["content"] || finish != want["finish_reason"] {
			t.Errorf("seed %d: streamed %q (%s), one reply %q (%s)", seed, text.String(), finish, want["message"].(map[string]any)["content"], want["finish_reason"])
		}
		last := evs[len(evs)-1]
		if len(last["choices"].([]any)) != 0 || fmt.Sprint(last["usage"]) != fmt.Sprint(one["usage"]) {
			t.Errorf("usage chunk %v, want no choices and usage %v", last, one["usage"])
		}

		cbody := map[string]any{"prompt": "ab", "max_tokens": 20, "seed": seed, "temperature": 1, "logprobs": 2, "stop": "c"}
		code, one = call(t, hs.URL+"/v1/completions", "", cbody)
		if code != 200 {
			t.Fatalf("completions: %d %v", code, one)
		}
		cwant := choices(one)[0]
		cbody["stream"] = true
		evs, done = events(t, hs.URL+"/v1/completions", cbody)
		text.Reset()
		var toks []any
		for _, e := range evs {
			if e["usage"] != nil || e["object"] != "text_completion" {
				t.Errorf("chunk %v: usage without include_usage, or not a text_completion", e)
			}
			c := choices(e)[0]
			text.WriteString(c["text"].(string))
			if lp, ok := c["logprobs"].(map[string]any); ok {
				toks = append(toks, lp["tokens"].([]any)...)
			}
			if f, ok := c["finish_reason"].(string); ok {
				finish = f
			}
		}
		if !done || text.String() != cwant["text"] || finish != cwant["finish_reason"] ||
			fmt.Sprint(toks) != fmt.Sprint(cwant["logprobs"].(map[string]any)["tokens"]) {
			t.Errorf("seed %d: streamed completion %q %s %v, one reply %q %s %v", seed, text.String(), finish, toks,
				cwant["text"], cwant["finish_reason"], cwant["logprobs"].(map[string]any)["tokens"])
		}

		gbody := map[string]any{"text": "ab", "sampling_params": map[string]any{"max_new_tokens": 20, "sampling_seed": seed, "stop": []string{"c"}}}
		code, one = call(t, hs.URL+"/generate", "", gbody)
		if code != 200 {
			t.Fatalf("generate: %d %v", code, one)
		}
		gbody["stream"] = true
		evs, done = events(t, hs.URL+"/generate", gbody)
		last = evs[len(evs)-1]
		if !done || last["text"] != one["text"] || fmt.Sprint(last["output_ids"]) != fmt.Sprint(one["output_ids"]) ||
			fmt.Sprint(last["meta_info"].(map[string]any)["finish_reason"]) != fmt.Sprint(one["meta_info"].(map[string]any)["finish_reason"]) {
			t.Errorf("seed %d: streamed /generate ends with %v, one reply %v", seed, last, one)
		}
		for i, e := range evs[:len(evs)-1] {
			if !strings.HasPrefix(last["text"].(string), e["text"].(string)) || e["meta_info"].(map[string]any)["finish_reason"] != nil {
				t.Errorf("/generate event %d %v: not a prefix of the final text, or finished early", i, e)
			}
		}
	}
}

// n completions of each prompt sample with seed, seed+1, …; a list of prompts gets n choices each,
// in order; usage counts every prompt once and every choice's tokens.
func TestNAndPromptLists(t *testing.T) {
	_, hs := toyServer(t, Options{})
	text := func(path string, body map[string]any) []string {
		code, r := call(t, hs.URL+path, "", body)
		if code != 200 {
			t.Fatalf("%s %v: %d %v", path, body, code, r)
		}
		var out []string
		for i, c := range choices(r) {
			if num(c["index"]) != i {
				t.Errorf("choice %d has index %v", i, c["index"])
			}
			if m, ok := c["message"].(map[string]any); ok {
				out = append(out, m["content"].(string))
			} else {
				out = append(out, c["text"].(string))
			}
		}
		return out
	}
	many := text("/v1/chat/completions", map[string]any{"messages": chatMsgs, "n": 3, "seed": 7, "max_tokens": 12})
	if len(many) != 3 || many[0] == many[1] && many[1] == many[2] {
		t.Fatalf("n 3: %q", many)
	}
	for k := 0; k < 3; k++ {
		if one := text("/v1/chat/completions", map[string]any{"messages": chatMsgs, "seed": 7 + k, "max_tokens": 12}); one[0] != many[k] {
			t.Errorf("choice %d %q, seed %d alone %q", k, many[k], 7+k, one[0])
		}
	}
	got := text("/v1/completions", map[string]any{"prompt": []string{"ab", "xyz"}, "n": 2, "seed": 3, "max_tokens": 6})
	ids := text("/v1/completions", map[string]any{"prompt": [][]int{{60, 61, 62}, {70}}, "n": 2, "seed": 3, "max_tokens": 6})
	if len(got) != 4 || len(ids) != 4 {
		t.Fatalf("2 prompts × n 2: %d and %d choices", len(got), len(ids))
	}
	for _, tc := range []struct {
		prompt any
		list   []string
		at     int
	}{{"ab", got, 0}, {"xyz", got, 2}, {[]int{60, 61, 62}, ids, 0}, {[]int{70}, ids, 2}} {
		for k := 0; k < 2; k++ {
			if one := text("/v1/completions", map[string]any{"prompt": tc.prompt, "seed": 3 + k, "max_tokens": 6}); one[0] != tc.list[tc.at+k] {
				t.Errorf("prompt %v choice %d: %q in the list, %q alone", tc.prompt, k, tc.list[tc.at+k], one[0])
			}
		}
	}
	_, r := call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": [][]int{{60, 61, 62}, {70}}, "n": 2, "seed": 3, "max_tokens": 6})
	u := r["usage"].(map[string]any)
	toks := 0
	_, withIDs := call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": [][]int{{60, 61, 62}, {70}}, "n": 2, "seed": 3, "max_tokens": 6, "return_token_ids": true})
	for _, c := range choices(withIDs) {
		toks += len(c["token_ids"].([]any))
	}
	if num(u["prompt_tokens"]) != 4 || num(u["completion_tokens"]) != toks || num(u["total_tokens"]) != 4+toks {
		t.Errorf("usage %v, want 4 prompt tokens and %d completion tokens", u, toks)
	}
	for _, bad := range []map[string]any{{"prompt": "a", "n": 0}, {"prompt": "a", "n": 129}, {"prompt": []string{}}, {"prompt": []any{1, "a"}}} {
		if code, r := call(t, hs.URL+"/v1/completions", "", bad); code != 400 || !isError(r) {
			t.Errorf("%v: %d %v, want 400 in the error shape", bad, code, r)
		}
	}
}

// logprobs / top_logprobs return that many alternatives per token, most likely first, the greedy
// token being the first; log-probs are ≤ 0 and their probabilities sum to at most 1.
func TestTopLogprobs(t *testing.T) {
	_, hs := toyServer(t, Options{})
	code, r := call(t, hs.URL+"/v1/chat/completions", "", map[string]any{"messages": chatMsgs, "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 3})
	if code != 200 {
		t.Fatalf("%d %v", code, r)
	}
	content := choices(r)[0]["logprobs"].(map[string]any)["content"].([]any)
	if len(content) == 0 {
		t.Fatal("no logprobs content")
	}
	for j, e := range content {
		e := e.(map[string]any)
		top := e["top_logprobs"].([]any)
		if len(top) != 3 {
			t.Fatalf("token %d: %d alternatives, want 3", j, len(top))
		}
		sum, prev := 0.0, 1.0
		for _, a := range top {
			lp := a.(map[string]any)["logprob"].(float64)
			if lp > prev || lp > 0 {
				t.Errorf("token %d: alternatives %v not descending", j, top)
			}
			prev = lp
			sum += math.Exp(lp)
		}
		first := top[0].(map[string]any)
		if sum > 1+1e-5 || first["token"] != e["token"] || first["logprob"] != e["logprob"] {
			t.Errorf("token %d %v: greedy token is not the best alternative %v (or probabilities sum to %g)", j, e, first, sum)
		}
	}
	code, r = call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": "ab", "max_tokens": 8, "seed": 2, "temperature": 1, "logprobs": 4})
	if code != 200 {
		t.Fatalf("%d %v", code, r)
	}
	lp := choices(r)[0]["logprobs"].(map[string]any)
	for j, m := range lp["top_logprobs"].([]any) {
		if n := len(m.(map[string]any)); n < 4 || n > 5 {
			t.Errorf("token %d: %d entries in top_logprobs, want the 4 best and the sampled one", j, n)
		}
	}
	if code, r := call(t, hs.URL+"/v1/chat/completions", "", map[string]any{"messages": chatMsgs, "top_logprobs": 21, "logprobs": true}); code != 400 || !isError(r) {
		t.Errorf("top_logprobs 21: %d %v", code, r)
	}
}

// Stop strings end the text before them (include_stop_str_in_output / no_stop_trim keep them),
// whichever tokens they span; the end-of-turn token never shows in the text unless
// skip_special_tokens is false.
func TestStopStringsAndSpecialTokens(t *testing.T) {
	s, hs := toyServer(t, Options{})
	// Find a completion with a run of printable ASCII to cut at.
	var full string
	var seed int
	for seed = 0; seed < 200; seed++ {
		_, r := call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": "ab", "max_tokens": 40, "seed": seed, "temperature": 1})
		full = choices(r)[0]["text"].(string)
		if i := asciiRun(full, 3); i > 0 {
			stop := full[i : i+3]
			cut := strings.Index(full, stop)
			for _, keep := range []bool{false, true} {
				_, r = call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": "ab", "max_tokens": 40, "seed": seed, "temperature": 1,
					"stop": []string{stop}, "include_stop_str_in_output": keep})
				want := full[:cut]
				if keep {
					want = full[:cut+3]
				}
				if c := choices(r)[0]; c["text"] != want || c["finish_reason"] != "stop" {
					t.Errorf("stop %q (keep %v): %q %v, want %q stop", stop, keep, c["text"], c["finish_reason"], want)
				}
			}
			break
		}
	}
	if seed == 200 {
		t.Fatal("no completion with three printable ASCII characters in a row in 200 seeds")
	}
	// The end-of-turn token: out of the text, in token_ids and logprobs.
	found := false
	for seed = 0; seed < 100 && !found; seed++ {
		_, r := call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": "ab", "max_tokens": 300, "seed": seed, "temperature": 1.5,
			"return_token_ids": true, "logprobs": 0})
		c := choices(r)[0]
		ids := c["token_ids"].([]any)
		last := num(ids[len(ids)-1])
		if c["finish_reason"] != "stop" || !s.pol.Tok.IsSpecial(last) {
			continue
		}
		found = true
		special := s.pol.Tok.Decode([]int{last})
		if strings.Contains(c["text"].(string), special) || len(c["logprobs"].(map[string]any)["tokens"].([]any)) != len(ids) {
			t.Errorf("seed %d: text %q holds %s, or the logprobs miss it", seed, c["text"], special)
		}
		_, r = call(t, hs.URL+"/v1/completions", "", map[string]any{"prompt": "ab", "max_tokens": 300, "seed": seed, "temperature": 1.5,
			"skip_special_tokens": false, "include_stop_str_in_output": true})
		if txt := choices(r)[0]["text"].(string); !strings.HasSuffix(txt, special) {
			t.Errorf("seed %d: with skip_special_tokens false the text %q does not end with %s", seed, txt, special)
		}
	}
	if !found {
		t.Fatal("no completion ended with a special stop token in 100 seeds")
	}
}

// asciiRun returns where n printable ASCII characters in a row start in s (after its first byte), or -1.
func asciiRun(s string, n int) int {
	run := 0
	for i := 1; i < len(s); i++ {
		if s[i] >= 0x21 && s[i] < 0x7f {
			run++
			if run == n {
				return i - n + 1
			}
		} else {
			run = 0
		}
	}
	return -1
}

// Models: GET /v1/models/{id} answers the served one and 404s others; a request for an unknown
// model is a 404; every error is in OpenAI's shape.
func TestModelsAndErrors(t *testing.T) {
	_, hs := toyServer(t, Options{Name: "toy"})
	if code, r := call(t, hs.URL+"/v1/models/toy", "", nil); code != 200 || r["id"] != "toy" || r["object"] != "model" {
		t.Errorf("GET /v1/models/toy: %d %v", code, r)
	}
	for _, tc := range []struct {
		path   string
		body   any
		status int
	}{
		{"/v1/models/gpt-4o", nil, 404},
		{"/v1/completions", map[string]any{"model": "gpt-4o", "prompt": "a"}, 404},
		{"/v1/chat/completions", map[string]any{"model": "gpt-4o", "messages": chatMsgs}, 404},
		{"/v1/chat/completions", map[string]any{"messages": chatMsgs, "temperature": -1}, 400},
		{"/v1/chat/completions", map[string]any{"messages": []any{}}, 400},
		{"/generate", map[string]any{"input_ids": []int{1}, "sampling_params": map[string]any{"max_new_tokens": 2000}}, 400},
		{"/no/such/endpoint", nil, 404},
		{"/update_weights_from_disk", map[string]any{"model_path": toyDir}, 403},
	} {
		code, r := call(t, hs.URL+tc.path, "", tc.body)
		if code != tc.status || !isError(r) {
			t.Errorf("%s %v: %d %v, want %d in the error shape", tc.path, tc.body, code, r, tc.status)
		}
		if tc.status == 404 && strings.HasPrefix(tc.path, "/v1/") && r["error"].(map[string]any)["code"] != "model_not_found" {
			t.Errorf("%s: error %v, want code model_not_found", tc.path, r["error"])
		}
	}
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	json.NewDecoder(resp.Body).Decode(&r)
	resp.Body.Close()
	if resp.StatusCode != 400 || !isError(r) {
		t.Errorf("bad JSON: %d %v", resp.StatusCode, r)
	}
}

// With a key every endpoint but /health answers 401 without it or with another one.
func TestAPIKeyOnEveryEndpoint(t *testing.T) {
	_, hs := toyServer(t, Options{APIKey: "s3cret", Name: "toy"})
	if resp, err := http.Get(hs.URL + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health: %v %v", resp, err)
	}
	gets := []string{"/get_model_info", "/v1/models", "/v1/models/toy", "/weight_info", "/nothing"}
	posts := []string{"/generate", "/v1/completions", "/v1/chat/completions", "/update_weights_from_disk", "/collective_rpc",
		"/reset_prefix_cache", "/update_weight_version"}
	for _, key := range []string{"", "wrong", "s3cre", "s3cret2"} {
		for _, p := range gets {
			if code, r := call(t, hs.URL+p, key, nil); code != 401 || !isError(r) {
				t.Errorf("GET %s key %q: %d %v, want 401", p, key, code, r)
			}
		}
		for _, p := range posts {
			if code, r := call(t, hs.URL+p, key, map[string]any{}); code != 401 || !isError(r) {
				t.Errorf("POST %s key %q: %d %v, want 401", p, key, code, r)
			}
		}
	}
	if code, r := call(t, hs.URL+"/v1/completions", "s3cret", map[string]any{"prompt": "a", "max_tokens": 2}); code != 200 {
		t.Errorf("with the key: %d %v", code, r)
	}
}
