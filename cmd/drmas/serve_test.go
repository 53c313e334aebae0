package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets a test start this binary as `drmas ARGS...` (a real child process running the CLI):
// with DRMAS_TEST_CLI=1 the arguments after "--" go to the root command. With DRMAS_TEST_RUNNER it is
// a gateway runner instead (dyingRunner).
func TestMain(m *testing.M) {
	if dir := os.Getenv("DRMAS_TEST_RUNNER"); dir != "" { // a gateway runner that dies (gateway_test.go)
		dyingRunner(dir)
	}
	if os.Getenv("DRMAS_TEST_CLI") == "1" {
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		root := newRootCmd()
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			fmt.Fprintln(os.Stderr, "drmas:", err)
			var ue usageError
			if errors.As(err, &ue) {
				os.Exit(2)
			}
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// server is a `drmas serve` child process.
type server struct {
	URL string
	cmd *exec.Cmd
}

// startServe starts `drmas serve --model dir --port 0` on 127.0.0.1 and waits for its address. The
// process is killed when the test ends.
func startServe(t testing.TB, dir string, extra ...string) *server {
	t.Helper()
	args := append([]string{"-test.run=^$", "--", "--log-level", "warn", "--device", "cpu", "serve", "--model", dir,
		"--host", "127.0.0.1", "--port", "0", "--threads", "1"}, extra...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "DRMAS_TEST_CLI=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd}
	t.Cleanup(s.kill)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line, ok := <-lines:
		if !ok || !strings.HasPrefix(line, "http://127.0.0.1:") {
			t.Fatalf("drmas serve printed %q; stderr:\n%s", line, stderr.String())
		}
		s.URL = line
	case <-time.After(90 * time.Second):
		t.Fatalf("drmas serve did not start in 90 s; stderr:\n%s", stderr.String())
	}
	return s
}

// kill stops the server at once (a crash, as far as its clients can tell).
func (s *server) kill() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		_ = s.cmd.Wait()
	}
}

func postJSON(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode, out
}

// The served completion of a seeded request is the local policy's, token for token, whichever
// protocol asks for it and whatever else is batched with it; bad requests are 400s.
func TestServeMatchesLocalGeneration(t *testing.T) {
	dir, p := toyModelDir(t)
	s := startServe(t, dir)
	prompt := []int{3, 4, 5, 6}
	local, _, err := execDrmas(t, "generate", "--model", dir, "--prompt-ids", "3,4,5,6", "--max-new-tokens", "6", "--seed", "11", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var want generateResult
	if err := json.Unmarshal([]byte(local), &want); err != nil {
		t.Fatal(err)
	}
	// Several concurrent requests with other seeds share the batch.
	done := make(chan struct{})
	for i := 0; i < 6; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			b, _ := json.Marshal(map[string]any{"input_ids": []int{7, 8, 9, 10, 11, 12}[:2+i%4], "sampling_params": map[string]any{"max_new_tokens": 5, "sampling_seed": i}})
			if resp, err := http.Post(s.URL+"/generate", "application/json", bytes.NewReader(b)); err == nil {
				resp.Body.Close()
			}
		}()
	}
	code, sg := postJSON(t, s.URL+"/generate", map[string]any{"input_ids": prompt, "return_logprob": true,
		"sampling_params": map[string]any{"max_new_tokens": 6, "sampling_seed": 11}})
	for i := 0; i < 6; i++ {
		<-done
	}
	if code != 200 {
		t.Fatalf("/generate: %d %v", code, sg)
	}
	ids := fmt.Sprint(sg["output_ids"])
	if ids != fmt.Sprint(want.ResponseIDs) {
		t.Fatalf("/generate sampled %s, local %v", ids, want.ResponseIDs)
	}
	lps := sg["meta_info"].(map[string]any)["output_token_logprobs"].([]any)
	for j, item := range lps {
		// Batched with other rows, float32 sums differ in the last bits (measured: ≤ 5e-6).
		if lp := item.([]any)[0].(float64); math.Abs(lp-float64(want.LogProbs[j])) > 1e-4 {
			t.Errorf("token %d: served log-prob %v, local %v", j, lp, want.LogProbs[j])
		}
	}
	code, oa := postJSON(t, s.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 6, "seed": 11, "logprobs": 1, "return_tokens_as_token_ids": true})
	if code != 200 {
		t.Fatalf("/v1/completions: %d %v", code, oa)
	}
	toks := oa["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["tokens"].([]any)
	for j, tok := range toks {
		if tok != fmt.Sprintf("token_id:%d", want.ResponseIDs[j]) {
			t.Errorf("/v1/completions token %d = %v, want token_id:%d", j, tok, want.ResponseIDs[j])
		}
	}
	code, chat := postJSON(t, s.URL+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "2+3?"}}, "max_tokens": 4, "seed": 1})
	if code != 200 || chat["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["role"] != "assistant" {
		t.Fatalf("/v1/chat/completions: %d %v", code, chat)
	}
	for name, body := range map[string]map[string]any{
		"outside vocab": {"input_ids": []int{1, p.Model.Config.VocabSize}},
		"no prompt":     {"sampling_params": map[string]any{"max_new_tokens": 2}},
		"batch":         {"input_ids": [][]int{{1, 2}, {3}}},
		"zero tokens":   {"input_ids": []int{1}, "sampling_params": map[string]any{"max_new_tokens": 0}},
	} {
		if code, _ := postJSON(t, s.URL+"/generate", body); code != 400 {
			t.Errorf("%s: HTTP %d, want 400", name, code)
		}
	}
	code, up := postJSON(t, s.URL+"/update_weights_from_disk", map[string]any{"model_path": dir, "weight_version": "v9"})
	if code != 403 {
		t.Errorf("reload on a server without --enable-weight-updates: %d %v, want 403", code, up)
	}
}

// A keyed server with weight updates: every endpoint but /health needs the key; a reload reads only
// under --weights-root, and a refused path gets one answer whether or not it exists.
func TestServeKeyAndWeightsRoot(t *testing.T) {
	dir, _ := toyModelDir(t)
	root := t.TempDir()
	s := startServe(t, dir, "--api-key", "k3y", "--enable-weight-updates", "--weights-root", root)
	call := func(path, key string, body any) (int, map[string]any) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, s.URL+path, bytes.NewReader(b))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	if resp, err := http.Get(s.URL + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health without a key: %v %v", resp, err)
	}
	gen := map[string]any{"input_ids": []int{3, 4}, "sampling_params": map[string]any{"max_new_tokens": 2}}
	for _, key := range []string{"", "wrong"} {
		if code, out := call("/generate", key, gen); code != 401 || out["error"] == nil {
			t.Errorf("key %q: %d %v, want 401 in the error shape", key, code, out)
		}
	}
	if code, out := call("/generate", "k3y", gen); code != 200 {
		t.Fatalf("with the key: %d %v", code, out)
	}
	code, up := call("/update_weights_from_disk", "k3y", map[string]any{"model_path": root})
	if code != 200 || up["success"] != false || !strings.Contains(fmt.Sprint(up["message"]), "config.json") {
		t.Errorf("reload from an empty folder under the root: %d %v", code, up)
	}
	var msgs []string
	for _, p := range []string{dir, dir + "/no-such-folder", "/etc/passwd"} {
		code, out := call("/update_weights_from_disk", "k3y", map[string]any{"model_path": p})
		if code != 403 {
			t.Errorf("reload from %s outside the root: %d %v, want 403", p, code, out)
		}
		msgs = append(msgs, strings.ReplaceAll(fmt.Sprint(out["error"]), p, "PATH"))
	}
	if msgs[0] != msgs[1] || msgs[1] != msgs[2] {
		t.Errorf("refusals differ with what exists outside the root:\n%s", strings.Join(msgs, "\n"))
	}
}

// The official OpenAI Node SDK (npm openai 6.x, installed by scripts/openai-node.sh into
// .cache/openai-node, or DRMAS_OPENAI_NODE) drives every row of issue #30's table against a keyed
// `drmas serve`, streaming included (scripts/openai-sdk-check.cjs). Skipped, saying why, without
// node or the SDK.
func TestServeOpenAINodeSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found: the OpenAI Node SDK test needs Node.js and scripts/openai-node.sh")
	}
	sdk := os.Getenv("DRMAS_OPENAI_NODE")
	if sdk == "" {
		sdk = "../../.cache/openai-node"
	}
	if _, err := os.Stat(sdk + "/node_modules/openai/package.json"); err != nil {
		t.Skipf("the OpenAI Node SDK is not installed in %s: run scripts/openai-node.sh (make test does)", sdk)
	}
	dir, _ := toyModelDir(t)
	s := startServe(t, dir, "--api-key", "sdk-key", "--name", "toy")
	cmd := exec.Command(node, "../../scripts/openai-sdk-check.cjs")
	cmd.Env = append(os.Environ(), "DRMAS_URL="+s.URL, "DRMAS_KEY=sdk-key", "DRMAS_MODEL=toy", "OPENAI_NODE="+sdk)
	out, err := cmd.CombinedOutput()
	t.Logf("openai-sdk-check:\n%s", out)
	if err != nil {
		t.Fatalf("the OpenAI Node SDK checks failed: %v", err)
	}
}
