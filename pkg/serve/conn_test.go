package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
	"github.com/drmas/drmas/pkg/torch"
)

// listen serves s on a loopback port through ListenAndServe (timeouts, connection bound) and
// returns its base URL.
func listen(t *testing.T, s *Server) string { return listenB(t, s) }

func listenB(t testing.TB, s *Server) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- s.ListenAndServe(ctx, "127.0.0.1:0", func(a net.Addr) { addr <- a }) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-addr:
		return "http://" + a.String()
	case err := <-done:
		t.Fatal(err)
	}
	return ""
}

func loadToy(t testing.TB) *policy.Policy {
	t.Helper()
	p := policytest.Load(t, toyDir)
	return p
}

// Weight updates are off by default: 403 and the same tokens after. On, a reload reads only under
// the root: a path outside it (an existing model, a missing folder, a file, a link out of the root)
// gets one refusal that does not depend on what is there; a folder with NaN weights is refused and
// the old weights keep serving.
func TestWeightUpdatesLockedDown(t *testing.T) {
	_, off := toyServer(t, Options{})
	ask := map[string]any{"input_ids": []int{60, 97, 110}, "sampling_params": map[string]any{"max_new_tokens": 8, "temperature": 0}}
	_, before := call(t, off.URL+"/generate", "", ask)
	for _, tc := range []struct {
		path string
		body any
	}{
		{"/update_weights_from_disk", map[string]any{"model_path": toyDir, "weight_version": "x"}},
		{"/collective_rpc", map[string]any{"method": "reload_weights"}},
		{"/update_weight_version", map[string]any{"new_version": "x"}},
	} {
		if code, r := call(t, off.URL+tc.path, "", tc.body); code != 403 || !isError(r) {
			t.Errorf("%s with updates off: %d %v, want 403", tc.path, code, r)
		}
	}
	_, after := call(t, off.URL+"/generate", "", ask)
	if fmt.Sprint(after["output_ids"]) != fmt.Sprint(before["output_ids"]) || after["meta_info"].(map[string]any)["weight_version"] != "default" {
		t.Errorf("served tokens or version changed: %v → %v", before, after)
	}

	root := t.TempDir()
	good, nan := filepath.Join(root, "good"), filepath.Join(root, "nan")
	p := loadToy(t)
	if err := torch.Do(func() error {
		if err := p.Save(good); err != nil {
			return err
		}
		if err := torch.NoGrad(func() error {
			p.Model.Parameters()[0].T.MustFill_(ts.FloatScalar(math.NaN()))
			return nil
		}); err != nil {
			return err
		}
		return p.Save(nan)
	}); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	file := filepath.Join(outside, "config.json")
	os.WriteFile(file, []byte("{not json"), 0o644)
	os.Symlink(outside, filepath.Join(root, "link"))
	_, on := toyServer(t, Options{WeightUpdates: true, WeightsRoot: root})
	_, before = call(t, on.URL+"/generate", "", ask)
	var refusals []string
	for _, path := range []string{toyDir, filepath.Join(outside, "missing"), file, outside, filepath.Join(root, "link"),
		filepath.Join(root, "link", "missing"), root + "/../" + filepath.Base(outside)} {
		for _, ep := range []struct {
			path string
			body any
		}{
			{"/update_weights_from_disk", map[string]any{"model_path": path}},
			{"/collective_rpc", map[string]any{"method": "update_config", "kwargs": map[string]any{"overrides": map[string]any{"model_config": map[string]any{"model": path}}}}},
		} {
			code, r := call(t, on.URL+ep.path, "", ep.body)
			if code != 403 || !isError(r) {
				t.Errorf("%s %s outside the root: %d %v, want 403", ep.path, path, code, r)
				continue
			}
			refusals = append(refusals, strings.ReplaceAll(r["error"].(map[string]any)["message"].(string), fmt.Sprintf("%q", path), "PATH"))
		}
	}
	for _, r := range refusals[1:] {
		if r != refusals[0] {
			t.Errorf("refusals differ with what is outside the root: %q vs %q", r, refusals[0])
		}
	}
	if code, r := call(t, on.URL+"/update_weights_from_disk", "", map[string]any{"model_path": filepath.Join(root, "missing")}); code != 400 || !isError(r) {
		t.Errorf("a missing folder under the root: %d %v, want 400", code, r)
	}
	code, r := call(t, on.URL+"/update_weights_from_disk", "", map[string]any{"model_path": nan, "weight_version": "bad"})
	if code != 200 || r["success"] != false || !strings.Contains(fmt.Sprint(r["message"]), "NaN") {
		t.Errorf("reload of NaN weights: %d %v, want success false naming NaN", code, r)
	}
	_, after = call(t, on.URL+"/generate", "", ask)
	if fmt.Sprint(after["output_ids"]) != fmt.Sprint(before["output_ids"]) || after["meta_info"].(map[string]any)["weight_version"] != "default" {
		t.Errorf("after a refused reload: %v, before %v", after, before)
	}
	if code, r := call(t, on.URL+"/update_weights_from_disk", "", map[string]any{"model_path": good, "weight_version": "v2"}); code != 200 || r["success"] != true {
		t.Errorf("reload under the root: %d %v", code, r)
	}
}

// A streaming client that leaves frees its row: generation stops within a few steps.
func TestDisconnectStopsGeneration(t *testing.T) {
	s, hs := toyServer(t, Options{})
	ask := map[string]any{"prompt": "ab", "max_tokens": 1000, "temperature": 0}
	if _, r := call(t, hs.URL+"/v1/completions", "", ask); num(r["usage"].(map[string]any)["completion_tokens"]) != 1000 {
		t.Fatalf("the greedy answer stops before 1000 tokens: %v", r["usage"])
	}
	base := s.tokens.Load()
	ask["stream"] = true
	b, _ := json.Marshal(ask)
	ctx, leave := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n') // the first chunk
	leave()
	resp.Body.Close()
	time.Sleep(300 * time.Millisecond)
	n := s.tokens.Load() - base
	time.Sleep(300 * time.Millisecond)
	if m := s.tokens.Load() - base; m != n || n >= 100 {
		t.Errorf("after the client left: %d tokens, then %d (of 1000 asked)", n, m)
	}
	t.Logf("%d tokens sampled before the row was dropped", n)
}

// Slow clients cannot hold the server: 100 connections that send a byte a second (50 in their
// headers, 50 in their bodies) do not slow a normal request, and are closed after the read timeout.
func TestSlowClients(t *testing.T) {
	p := loadToy(t)
	s, err := New(p, toyDir, Options{ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxConns: 200})
	if err != nil {
		t.Fatal(err)
	}
	url := listen(t, s)
	addr := strings.TrimPrefix(url, "http://")
	ask := map[string]any{"messages": chatMsgs, "max_tokens": 16, "seed": 1}
	normal := func() time.Duration {
		began := time.Now()
		if code, r := call(t, url+"/v1/chat/completions", "", ask); code != 200 {
			t.Fatalf("normal request: %d %v", code, r)
		}
		return time.Since(began)
	}
	normal()
	alone := normal()
	body := `{"prompt": "ab", "max_tokens": 2}`
	head := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)+100)
	var wg sync.WaitGroup
	closed := make([]time.Duration, 100)
	began := time.Now()
	for i := 0; i < 100; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := 0
		if i%2 == 1 {
			c.Write([]byte(head)) // headers at once, then the body a byte a second
			start = len(head)
		}
		wg.Add(2)
		go func() { // trickle
			defer wg.Done()
			msg := head + body
			for j := start; j < len(msg); j++ {
				if _, err := c.Write([]byte{msg[j]}); err != nil {
					return
				}
				time.Sleep(time.Second)
			}
		}()
		go func() { // wait for the server to close it
			defer wg.Done()
			io.Copy(io.Discard, c)
			closed[i] = time.Since(began)
			c.Close()
		}()
	}
	time.Sleep(200 * time.Millisecond)
	during := normal()
	wg.Wait()
	worst := time.Duration(0)
	for _, d := range closed {
		worst = max(worst, d)
	}
	t.Logf("normal request alone %v, with 100 slow clients %v; the slow ones closed after at most %v", alone, during, worst)
	if during > 3*alone+time.Second {
		t.Errorf("a normal request took %v with slow clients, %v alone", during, alone)
	}
	if worst > 4*time.Second {
		t.Errorf("slow clients held their connection %v (read timeout 2s)", worst)
	}
}

// A prompt text too long for the model is refused before it is tokenized, and request bodies in
// flight are bounded: past the budget a request gets 503 until the held ones finish.
func TestLongPromptsAndBodyBudget(t *testing.T) {
	p := loadToy(t)
	s, err := New(p, toyDir, Options{MaxInflightBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	url := listen(t, s)
	long := strings.Repeat("a", 200_000)
	began := time.Now()
	for _, tc := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": long}},
		{"/v1/completions", map[string]any{"prompt": []string{"a", long}}},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": long}}}},
		{"/generate", map[string]any{"text": long}},
	} {
		code, r := call(t, url+tc.path, "", tc.body)
		if code != 400 || !isError(r) || !strings.Contains(fmt.Sprint(r["error"]), "bytes of text") {
			t.Errorf("%s with %d bytes of text: %d %v", tc.path, len(long), code, r)
		}
	}
	t.Logf("4 texts of 200 kB refused in %v", time.Since(began))

	// One request holds 350 kB of its body (and waits); another of 350 kB does not fit beside it (each counts twice its size).
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 2<<20)
	c.Write(bytes.Repeat([]byte(" "), 350<<10))
	time.Sleep(300 * time.Millisecond)
	big := map[string]any{"prompt": "ab", "max_tokens": 1, "user": strings.Repeat("u", 350<<10)}
	if code, r := call(t, url+"/v1/completions", "", big); code != 503 || !isError(r) {
		t.Errorf("a 350 kB request beside one holding 350 kB of a 1 MiB budget: %d %v, want 503", code, r)
	}
	c.Close()
	time.Sleep(300 * time.Millisecond)
	if code, r := call(t, url+"/v1/completions", "", big); code != 200 {
		t.Errorf("once the held request is gone: %d %v, want 200", code, r)
	}
}

// 200 concurrent streamed chats on 127.0.0.1 all complete, each with [DONE]; a client that has its
// first chunk has it while its generation still runs (TestDisconnectStopsGeneration: a client that
// leaves after its first chunk stops its row after a token or so of 1000).
func TestManyConcurrentStreams(t *testing.T) {
	s, err := New(loadToy(t), toyDir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	url := listen(t, s)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	began := time.Now()
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, _, err := streamChat(url, map[string]any{"messages": chatMsgs, "max_tokens": 16, "seed": i, "temperature": 1}); err != nil {
				errs <- fmt.Errorf("stream %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("200 concurrent streams of ≤ 16 tokens in %v", time.Since(began))
}

// Connections are bounded and idle ones closed: with every slot of --max-conns held by idle
// keep-alive clients and clients that never send, /health still answers once the idle and header
// timeouts free slots (before: 19,990 idle connections took every file descriptor).
func TestIdleConnectionsDoNotStarveTheServer(t *testing.T) {
	s, err := New(loadToy(t), toyDir, Options{MaxConns: 20, MaxConnsPerClient: 1000, ReadHeaderTimeout: time.Second, IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	url := listen(t, s)
	addr := strings.TrimPrefix(url, "http://")
	for i := 0; i < 30; i++ { // more than the bound: the last wait to be accepted
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i%2 == 0 { // one request, then idle on the kept-alive connection
			go func() {
				fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
				io.Copy(io.Discard, c)
			}()
		}
	}
	time.Sleep(100 * time.Millisecond)
	began := time.Now()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health with every connection slot held: %v %v", resp, err)
	}
	resp.Body.Close()
	if waited := time.Since(began); waited > 4*time.Second {
		t.Errorf("/health waited %v for a slot (idle and header timeouts 1s)", waited)
	} else {
		t.Logf("/health answered after %v with 30 idle clients and 20 slots", waited)
	}
}

// The listener hands out at most n connections at once; the next waits until one closes.
func TestLimitListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newLimitListener(raw, 2, 0)
	defer ln.Close()
	for i := 0; i < 3+overflowConns; i++ {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	a, _ := ln.Accept()
	ln.Accept()
	for i := 0; i < overflowConns; i++ { // the overflow connections (/health only)
		if c, err := ln.Accept(); err != nil || !c.(*limitConn).overflow {
			t.Fatalf("overflow connection %d: %v", i, err)
		}
	}
	third := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		third <- c
	}()
	select {
	case <-third:
		t.Fatal("a connection was accepted beyond the bound of 2 and the overflow ones")
	case <-time.After(200 * time.Millisecond):
	}
	a.Close()
	select {
	case c := <-third:
		c.Close()
	case <-time.After(2 * time.Second):
		t.Fatal("the third connection was not accepted after one closed")
	}
}
