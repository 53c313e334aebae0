package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
)

// TestMain lets a test start this binary as a runner drmas supervises (runner.command): with
// GATEWAY_TEST_RUNNER set, it serves POST /run at DRMAS_RUNNER_URL (helperRunner).
func TestMain(m *testing.M) {
	if dir := os.Getenv("GATEWAY_TEST_RUNNER"); dir != "" {
		helperRunner(dir)
		return
	}
	os.Exit(m.Run())
}

// helperRunner is a runner process: each episode calls the solver once, leaves a file in dir saying
// it started, waits 300 ms and answers reward 1. It exits at once, before listening, while dir holds
// a file named "dead".
func helperRunner(dir string) {
	if _, err := os.Stat(filepath.Join(dir, "dead")); err == nil {
		os.Exit(3)
	}
	u, _ := url.Parse(os.Getenv("DRMAS_RUNNER_URL"))
	http.HandleFunc("POST /run", func(w http.ResponseWriter, r *http.Request) {
		var req runRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("started-%d", os.Getpid())), nil, 0o644)
		body := strings.NewReader(`{"model": "solver", "messages": [{"role": "user", "content": "x"}]}`)
		hr, _ := http.NewRequest(http.MethodPost, req.BaseURL+"/chat/completions", body)
		hr.Header.Set("Authorization", "Bearer "+req.APIKey)
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		resp.Body.Close()
		time.Sleep(300 * time.Millisecond)
		fmt.Fprint(w, `{"reward": 1}`)
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe(u.Host, nil))
	os.Exit(1)
}

// freeURL is a loopback URL nothing listens on (yet).
func freeURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}

// startedBy waits until a runner process has begun an episode (its marker file in dir).
func startedBy(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m, _ := filepath.Glob(filepath.Join(dir, "started-*")); len(m) > 0 {
			return
		}
	}
	t.Fatal("the runner began no episode in 30 s")
}

// A runner drmas started that is killed mid-run (SIGKILL while its episodes are in flight): the
// supervisor restarts it and the episodes it was playing are played again on the new process —
// retried, none failed, none scored without its runner's answer.
func TestRunnerKilledMidRun(t *testing.T) {
	dir := t.TempDir()
	g := newTestGateway(t, Config{URL: freeURL(t), Command: os.Args[0], Env: map[string]string{"GATEWAY_TEST_RUNNER": dir}, Attempts: 2, StartTimeout: 20 * time.Second})
	type result struct {
		roll *env.Rollout
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "a"}, {ID: "b"}}, 2, env.RunOptions{})
		done <- result{r, err}
	}()
	startedBy(t, dir)
	g.runner.mu.Lock()
	first := g.runner.cmd.Process
	g.runner.mu.Unlock()
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("a runner killed mid-run stopped the run: %v", res.err)
	}
	if len(res.roll.Trajectories) != 4 || res.roll.RewardStats[MetricFailed] != 0 || res.roll.RewardStats[MetricRetried] < 1 {
		t.Errorf("%d trajectories, stats %v: want all 4, some retried, none failed", len(res.roll.Trajectories), res.roll.RewardStats)
	}
	for _, tr := range res.roll.Trajectories {
		if tr.Reward != 1 || len(tr.Calls) != 1 {
			t.Errorf("trajectory %s: reward %g, %d calls (a killed attempt's calls kept?)", tr.TrajUID, tr.Reward, len(tr.Calls))
		}
	}
	g.runner.mu.Lock()
	again := g.runner.cmd.Process
	g.runner.mu.Unlock()
	if again.Pid == first.Pid {
		t.Error("the runner was not restarted")
	}
}

// A runner that dies and cannot come back (each restart exits at once): the run stops within
// runner.start_timeout with an error naming the runner's URL, instead of waiting forever or
// scoring the episodes.
func TestRunnerDiesForGood(t *testing.T) {
	dir := t.TempDir()
	u := freeURL(t)
	g := newTestGateway(t, Config{URL: u, Command: os.Args[0], Env: map[string]string{"GATEWAY_TEST_RUNNER": dir}, Attempts: 2, StartTimeout: 3 * time.Second})
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		_, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "a"}}, 2, env.RunOptions{})
		done <- err
	}()
	startedBy(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "dead"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	g.runner.mu.Lock()
	_ = g.runner.cmd.Process.Kill()
	g.runner.mu.Unlock()
	err := <-done
	if err == nil || !errors.Is(err, errUnreachable) || !strings.Contains(err.Error(), u) || !strings.Contains(err.Error(), "start_timeout") {
		t.Fatalf("err = %v, want the runner unreachable, naming %s and runner.start_timeout", err, u)
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("the run took %s to stop (start_timeout 3s)", took)
	}
}

// The runner's notes on each call: valid false makes the call invalid (scored with the penalty),
// role_reward overrides its agent's; a list whose length is not the episode's call count, or a
// role reward that is not a finite number, fails the episode, naming why.
func TestRunnerCallNotes(t *testing.T) {
	reply := `{"reward": 1, "agent_rewards": {"solver": 0.5, "verifier": 0.25}, "calls": [{"valid": false}, {"role_reward": 0.75}]}`
	url := runnerFunc(t, func(w http.ResponseWriter, req runRequest) {
		for _, agent := range []string{"solver", "verifier"} {
			post(t, req.BaseURL, req.APIKey, "/chat/completions", map[string]any{"model": agent, "messages": []map[string]string{{"role": "user", "content": "q"}}})
		}
		fmt.Fprint(w, reply)
	})
	g := newTestGateway(t, Config{URL: url, Attempts: 1})
	roll, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "t"}}, 1, env.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := roll.Trajectories[0].Calls
	// solver: role weight 0, invalid: 1 − 0.1; verifier: role weight 0.5, its own role reward 0.75.
	if c[0].Valid || c[0].RoleReward != 0.5 || math.Abs(c[0].Score-0.9) > 1e-12 || !c[1].Valid || c[1].RoleReward != 0.75 || c[1].Score != 0.5+0.5*0.75 {
		t.Errorf("calls %+v %+v", c[0], c[1])
	}
	for _, bad := range []string{`{"reward": 1, "calls": [{"valid": true}]}`, `{"reward": 1, "calls": [{}, {"role_reward": 1e300}]}`, `{"reward": 1, "calls": [{"ok": 1}, {}]}`} {
		reply = bad
		_, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "t"}}, 1, env.RunOptions{})
		if err == nil || !strings.Contains(err.Error(), "every one of the 1 episodes failed") {
			t.Errorf("%s: err = %v", bad, err)
		}
	}
}

// The rollout's wall time split: generation, the endpoint's own work and the runner's time add up to
// the wall time of Run, each where it was spent (a runner that thinks 200 ms per episode, a
// generator that takes 100 ms per call).
func TestTimeSplit(t *testing.T) {
	url := runnerFunc(t, func(w http.ResponseWriter, req runRequest) {
		time.Sleep(200 * time.Millisecond)
		post(t, req.BaseURL, req.APIKey, "/chat/completions", map[string]any{"model": "solver", "messages": []map[string]string{{"role": "user", "content": "q"}}})
		fmt.Fprint(w, `{"reward": 0}`)
	})
	g := newTestGateway(t, Config{URL: url, Concurrency: 1})
	began := time.Now()
	roll, err := g.Run(context.Background(), slowGen{&fakeGen{}, 100 * time.Millisecond}, []env.Task{{ID: "t"}}, 2, env.RunOptions{})
	wall := time.Since(began).Seconds()
	if err != nil {
		t.Fatal(err)
	}
	s := roll.RewardStats
	gen, serve, runner := s[MetricTimeGeneration], s[MetricTimeHTTP], s[MetricTimeRunner]
	if gen < 0.2 || gen > 0.3 || runner < 0.4 || serve < 0 || serve > 0.1 || math.Abs(gen+serve+runner-wall) > 0.05 {
		t.Errorf("generation %.3fs, http %.3fs, runner %.3fs, wall %.3fs: want ≈ 0.2, small, ≥ 0.4, adding up", gen, serve, runner, wall)
	}
}

// slowGen is a generator that takes a while per Generate call.
type slowGen struct {
	*fakeGen
	wait time.Duration
}

func (g slowGen) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	time.Sleep(g.wait)
	return g.fakeGen.Generate(ctx, reqs)
}

// countingGen records the size of each Generate call and fails any batch holding a request whose
// agent is "bad".
type countingGen struct {
	fakeGen
	sizes []int
}

func (g *countingGen) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	g.mu.Lock()
	g.sizes = append(g.sizes, len(reqs))
	g.mu.Unlock()
	for _, r := range reqs {
		if r.Agent == "bad" {
			return nil, errors.New("bad request")
		}
	}
	return g.fakeGen.Generate(ctx, reqs)
}

// Gathering: the calls of the episodes being played go to the generator together once each has one
// waiting; a call whose episode is the only one waiting goes after gatherWait at most; a batch that
// fails is retried call by call, so one bad request fails only its own call.
func TestGather(t *testing.T) {
	gen := &countingGen{}
	g := newGather(context.Background(), gen, newClock())
	for range 3 {
		g.begin()
	}
	call := func(agent string) error {
		_, err := g.Generate(context.Background(), []llm.Request{{Agent: agent}})
		return err
	}
	errs := make(chan error, 3)
	for _, a := range []string{"solver", "verifier", "solver"} {
		go func() { errs <- call(a) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if len(gen.sizes) != 1 || gen.sizes[0] != 3 {
		t.Errorf("Generate calls of %v requests, want one of 3", gen.sizes)
	}
	began := time.Now()
	if err := call("solver"); err != nil || time.Since(began) > 5*gatherWait {
		t.Errorf("a lone call: %v after %s, want an answer within %s", err, time.Since(began), gatherWait)
	}
	go func() { errs <- call("bad") }()
	go func() { errs <- call("solver") }()
	go func() { errs <- call("verifier") }()
	var failed int
	for range 3 {
		if err := <-errs; err != nil {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d calls failed, want only the bad one", failed)
	}
	g.end()
	g.end()
	g.end()
}

// A data-parallel rank other than local rank 0 starts no runner of its own: it plays its episodes on
// the one local rank 0 started (here a command that could not start would fail the run).
func TestRunnerSharedByRanks(t *testing.T) {
	t.Setenv("LOCAL_RANK", "1")
	url := runnerFunc(t, func(w http.ResponseWriter, _ runRequest) { fmt.Fprint(w, `{"reward": 1}`) })
	g := newTestGateway(t, Config{URL: url, Command: "/nonexistent/runner"})
	roll, err := g.Run(context.Background(), &fakeGen{}, []env.Task{{ID: "t"}}, 2, env.RunOptions{})
	if err != nil || len(roll.Trajectories) != 2 || g.runner.cmd != nil {
		t.Fatalf("rank 1: err %v, started %v", err, g.runner.cmd)
	}
}
