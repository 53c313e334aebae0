package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/drmas/drmas/pkg/train"
)

// toyTeam is configs/toy-math.yaml shrunk to a few seconds: one tiny model shared by the solver and
// the verifier, dtype as given, three iterations.
func toyTeam(t *testing.T, dir, dtype string, sets ...string) *config.Config {
	t.Helper()
	cfg, err := config.Load("../../configs/toy-math.yaml", append(toyTeamSets(dir, dtype), sets...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Models {
		cfg.Models[i].Tokenizer = "../../" + cfg.Models[i].Tokenizer
	}
	return cfg
}

// toyTeamSets are toyTeam's --set overrides of configs/toy-math.yaml.
func toyTeamSets(dir, dtype string) []string {
	return []string{"run.dir=" + dir, "run.steps=3", "run.save_every=1", "run.test_freq=0", "run.keep_last=0",
		"run.threads=1", "warmup.steps=2", "warmup.batch_size=8", "models.0.dtype=" + dtype,
		"models.0.init={model_type: qwen2, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}",
		"algorithm.batch_size=4", "algorithm.group_size=4", "algorithm.micro_batch_size=8",
		"agents.0.sampling.max_new_tokens=4", "agents.1.sampling.max_new_tokens=4", "toy.train=64", "toy.val=8"}
}

// engineKey is the API key the engine tests' replicas require and their trainings send.
const engineKey = "engine-test-key"

// startReplica starts a `drmas serve` replica as a training uses one: behind an API key, with
// weight updates on from the folder every test's run folders are made in.
func startReplica(t testing.TB, dir string, extra ...string) *server {
	return startServe(t, dir, append([]string{"--api-key", engineKey, "--enable-weight-updates", "--weights-root", os.TempDir()}, extra...)...)
}

// withEngine points the config's model at replicas (sending engineKey).
func withEngine(cfg *config.Config, kind string, timeout time.Duration, urls ...string) *config.Config {
	cfg.Models[0].Rollout = engine.Config{Engine: kind, URLs: urls, MaxInflight: 16, Timeout: timeout, Retries: 3,
		MaxLogprobDiff: engine.DefaultMaxLogprobDiff, APIKey: engineKey}
	return cfg
}

func runTraining(t *testing.T, cfg *config.Config, resume bool) error {
	t.Helper()
	tr, err := train.New(context.Background(), cfg, train.Options{Device: "cpu", Resume: resume})
	if err != nil {
		return err
	}
	defer tr.Close()
	return tr.Run(context.Background())
}

// rows reads metrics.jsonl; timing figures and the engine/trainer log-prob difference (absent from a
// local run) are split off into diffs.
func rows(t *testing.T, dir string) (out []map[string]any, diffs []float64) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, rundir.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var row map[string]any
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatal(err)
		}
		for k, v := range row {
			switch {
			case strings.HasPrefix(k, "rollout/logprob_diff/") && strings.HasSuffix(k, "/max"):
				diffs = append(diffs, v.(float64))
				delete(row, k)
			case strings.HasPrefix(k, "time/"), strings.HasPrefix(k, "perf/"), strings.HasPrefix(k, "rollout/"):
				delete(row, k)
			}
		}
		out = append(out, row)
	}
	return out, diffs
}

// column returns one metric's values, iteration by iteration.
func column(t *testing.T, dir, key string) []float64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, rundir.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var row map[string]any
		if err := json.Unmarshal(line, &row); err != nil {
			t.Fatal(err)
		}
		if v, ok := row[key].(float64); ok {
			out = append(out, v)
		}
	}
	return out
}

// maxDiff compares two runs' metrics and final weights; it returns the largest absolute difference
// of any metric and whether the final weights are byte-identical.
func maxDiff(t *testing.T, a, b string, steps int) (float64, bool) {
	t.Helper()
	worst := metricsDiff(t, a, b, steps)
	wa, err := os.ReadFile(filepath.Join(a, fmt.Sprintf("step-%d", steps), "small", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	wb, err := os.ReadFile(filepath.Join(b, fmt.Sprintf("step-%d", steps), "small", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	return worst, bytes.Equal(wa, wb)
}

// metricsDiff is the largest absolute difference of any metric of two runs of steps iterations.
func metricsDiff(t *testing.T, a, b string, steps int) float64 {
	t.Helper()
	ra, _ := rows(t, a)
	rb, _ := rows(t, b)
	if len(ra) != steps || len(rb) != steps {
		t.Fatalf("%d and %d metrics rows, want %d", len(ra), len(rb), steps)
	}
	worst := 0.0
	for i := range ra {
		if len(ra[i]) != len(rb[i]) {
			t.Fatalf("row %d: %d keys vs %d", i+1, len(ra[i]), len(rb[i]))
		}
		for k, x := range ra[i] {
			y, ok := rb[i][k]
			if !ok {
				t.Fatalf("row %d: %s missing", i+1, k)
			}
			xf, _ := x.(float64)
			yf, _ := y.(float64)
			worst = math.Max(worst, math.Abs(xf-yf))
		}
	}
	return worst
}

// initialFolder writes a model folder of the config's architecture for drmas serve to start from
// (its weights do not matter: the trainer syncs its own before the first rollout).
func initialFolder(t *testing.T, cfg *config.Config) string {
	t.Helper()
	c := *cfg
	c.Run.Seed = 99 // other weights than the trainer's
	team, err := train.LoadTeam(&c, "cpu", "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := saveModel(team, "small", dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The remote path changes where tokens are sampled, not what is learned: on a float64 toy model the
// metrics and weights of a run whose rollouts go to two drmas serve replicas, through each engine's
// protocol, equal the local engine's run with the same seeds, and after every sync the served
// log-probs match the trainer's.
func TestEnginesTrainLikeLocal(t *testing.T) {
	local := t.TempDir()
	if err := runTraining(t, toyTeam(t, local, "float64"), false); err != nil {
		t.Fatal(err)
	}
	start := initialFolder(t, toyTeam(t, t.TempDir(), "float64"))
	a := startReplica(t, start, "--dtype", "float64")
	b := startReplica(t, start, "--dtype", "float64")
	for _, kind := range []string{engine.SGLang, engine.VLLM, engine.OpenAI} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			if err := runTraining(t, withEngine(toyTeam(t, dir, "float64"), kind, time.Minute, a.URL, b.URL), false); err != nil {
				t.Fatal(err)
			}
			worst, same := maxDiff(t, local, dir, 3)
			_, diffs := rows(t, dir)
			t.Logf("%s: largest metric difference %g, final weights identical: %v, served-vs-trainer log-prob max diff per iteration %v", kind, worst, same, diffs)
			if worst > 1e-9 || !same {
				t.Errorf("%s run differs from the local run: metric diff %g, same weights %v", kind, worst, same)
			}
			if len(diffs) != 3 {
				t.Fatalf("rollout/logprob_diff logged in %d of 3 iterations", len(diffs))
			}
			if got := column(t, dir, "rollout/replicas/small"); fmt.Sprint(got) != "[2 2 2]" {
				t.Errorf("rollout/replicas/small = %v, want 2 in each iteration", got)
			}
			for i, d := range diffs {
				if d > 1e-4 {
					t.Errorf("iteration %d: served log-probs differ from the trainer's by %g (> 1e-4)", i+1, d)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, engine.WeightsDir, "small", "v3")); err != nil {
				t.Errorf("the last synced weights folder: %v", err)
			}
			if old, _ := filepath.Glob(filepath.Join(dir, engine.WeightsDir, "small", "v[0-2]")); len(old) > 0 {
				t.Errorf("old weights versions kept: %v", old)
			}
		})
	}
}

// On float32, batch composition changes sums in the last bits: the served log-probs still match the
// trainer's to 1e-4, and the run's metrics stay within a bound (reported).
func TestEnginesFloat32Difference(t *testing.T) {
	local, remote := t.TempDir(), t.TempDir()
	if err := runTraining(t, toyTeam(t, local, "float32"), false); err != nil {
		t.Fatal(err)
	}
	a := startReplica(t, initialFolder(t, toyTeam(t, t.TempDir(), "float32")))
	if err := runTraining(t, withEngine(toyTeam(t, remote, "float32"), engine.SGLang, time.Minute, a.URL), false); err != nil {
		t.Fatal(err)
	}
	worst, same := maxDiff(t, local, remote, 3)
	_, diffs := rows(t, remote)
	t.Logf("float32: largest metric difference %g, final weights identical: %v, log-prob max diff per iteration %v", worst, same, diffs)
	for i, d := range diffs {
		if d > 1e-4 {
			t.Errorf("iteration %d: served log-probs differ from the trainer's by %g", i+1, d)
		}
	}
	if worst > 1e-3 {
		t.Errorf("float32 remote run drifts from the local one by %g (> 1e-3)", worst)
	}
}

// proxy stands in front of a replica and lets a test break it: hook may answer a request itself
// (returning true) instead of passing it on.
func proxy(t *testing.T, target string, hook func(w http.ResponseWriter, r *http.Request) bool) *httptest.Server {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hook == nil || !hook(w, r) {
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func TestEngineFaults(t *testing.T) {
	local := t.TempDir()
	if err := runTraining(t, toyTeam(t, local, "float64"), false); err != nil {
		t.Fatal(err)
	}
	start := initialFolder(t, toyTeam(t, t.TempDir(), "float64"))
	same := func(t *testing.T, dir string) {
		t.Helper()
		if worst, identical := maxDiff(t, local, dir, 3); worst > 1e-9 || !identical {
			t.Errorf("run differs from the uninterrupted local run: metric diff %g, same weights %v", worst, identical)
		}
	}

	t.Run("down at start", func(t *testing.T) {
		dead := httptest.NewServer(http.NotFoundHandler())
		dead.Close()
		dir := t.TempDir()
		err := runTraining(t, withEngine(toyTeam(t, dir, "float64"), engine.SGLang, time.Minute, dead.URL), false)
		if err == nil || !strings.Contains(err.Error(), dead.URL) || !strings.Contains(err.Error(), "not reachable") {
			t.Fatalf("err = %v, want one naming %s", err, dead.URL)
		}
		if _, err := os.Stat(filepath.Join(dir, rundir.MetricsFile)); err == nil {
			t.Error("training started although the engine was down")
		}
	})

	a := startReplica(t, start, "--dtype", "float64")
	b := startReplica(t, start, "--dtype", "float64")

	t.Run("slow and malformed replicas", func(t *testing.T) {
		var slow, bad atomic.Int32
		slowP := proxy(t, a.URL, func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/generate" && slow.Add(1) <= 3 {
				time.Sleep(1500 * time.Millisecond) // past the timeout: the request goes to another replica
			}
			return false
		})
		badP := proxy(t, b.URL, func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/generate" && bad.Add(1)%3 == 0 {
				io.WriteString(w, `{"text": "x", "meta_info": {"finish_reason": {"type": "stop"}, "output_token_log`)
				return true
			}
			return false
		})
		dir := t.TempDir()
		if err := runTraining(t, withEngine(toyTeam(t, dir, "float64"), engine.SGLang, time.Second, slowP.URL, badP.URL), false); err != nil {
			t.Fatal(err)
		}
		if slow.Load() < 3 || bad.Load() < 2 {
			t.Fatalf("faults not exercised: %d slow, %d bad", slow.Load(), bad.Load())
		}
		same(t, dir)
	})

	t.Run("stale replica detected", func(t *testing.T) {
		stale := proxy(t, a.URL, func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/update_weights_from_disk" { // acknowledges, loads nothing
				io.WriteString(w, `{"success": true, "message": "Succeeded to update model weights."}`)
				return true
			}
			return false
		})
		err := runTraining(t, withEngine(toyTeam(t, t.TempDir(), "float64"), engine.SGLang, time.Minute, b.URL, stale.URL), false)
		var se *engine.StaleError
		if !errors.As(err, &se) || se.URL != stale.URL {
			t.Fatalf("err = %v, want a StaleError for %s", err, stale.URL)
		}
	})

	t.Run("confident wrong log-probs", func(t *testing.T) {
		// The replica samples, but reports every sampled token as near-certain: the log-probs are not
		// those of the weights being trained (as an engine serving other weights would report).
		tampered := proxy(t, b.URL, func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/generate" {
				return false
			}
			fwd, _ := http.NewRequest(http.MethodPost, b.URL+"/generate", r.Body)
			fwd.Header.Set("Authorization", r.Header.Get("Authorization"))
			resp, err := http.DefaultClient.Do(fwd)
			if err != nil {
				http.Error(w, err.Error(), 502)
				return true
			}
			defer resp.Body.Close()
			var rep map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
				http.Error(w, err.Error(), 502)
				return true
			}
			for _, e := range rep["meta_info"].(map[string]any)["output_token_logprobs"].([]any) {
				e.([]any)[0] = -1e-4
			}
			_ = json.NewEncoder(w).Encode(rep)
			return true
		})
		dir := t.TempDir()
		err := runTraining(t, withEngine(toyTeam(t, dir, "float64"), engine.SGLang, time.Minute, a.URL, tampered.URL), false)
		if !errors.Is(err, train.ErrReplicaDiverged) || !strings.Contains(err.Error(), "replica "+tampered.URL) ||
			strings.Contains(err.Error(), "replica "+a.URL) || !strings.Contains(err.Error(), "max_logprob_diff 0.1") {
			t.Fatalf("err = %v, want ErrReplicaDiverged naming %s alone", err, tampered.URL)
		}
		if n := countLines(filepath.Join(dir, rundir.MetricsFile)); n != 0 {
			t.Fatalf("%d iterations trained on the tampered replica's tokens", n)
		}
		t.Logf("%v", err)
	})

	t.Run("killed mid-run, then all lost and resumed", func(t *testing.T) { // the last: it kills a
		c, d := a, b
		var calls atomic.Int32
		var lost atomic.Bool
		// c dies during the first iteration's rollout; d dies at the second iteration's.
		cp := proxy(t, c.URL, func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/generate" && calls.Add(1) == 8 {
				c.kill()
			}
			return false
		})
		dp := proxy(t, d.URL, func(w http.ResponseWriter, r *http.Request) bool {
			if lost.Load() {
				panic(http.ErrAbortHandler) // the connection drops, as when a server dies
			}
			return false
		})
		dir := t.TempDir()
		cfg := withEngine(toyTeam(t, dir, "float64", "run.save_every=0"), engine.SGLang, 2*time.Second, cp.URL, dp.URL)
		go func() { // lose d once iteration 1 is written
			for !lost.Load() {
				if data, _ := os.ReadFile(filepath.Join(dir, rundir.MetricsFile)); bytes.Count(data, []byte("\n")) >= 1 {
					lost.Store(true)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		err := runTraining(t, cfg, false)
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "step-1")); err != nil {
			t.Fatalf("no checkpoint of what was learned before the engines were lost: %v", err)
		}
		// The engines are back (a fresh replica): --resume continues as if nothing happened.
		e := startReplica(t, start, "--dtype", "float64")
		if err := runTraining(t, withEngine(toyTeam(t, dir, "float64", "run.save_every=0"), engine.SGLang, time.Minute, e.URL), true); err != nil {
			t.Fatal(err)
		}
		same(t, dir)
	})
}

// saveModel writes one of a team's models to dir.
func saveModel(team *train.Team, id, dir string) error {
	p := team.Router[id]
	if p == nil {
		return fmt.Errorf("no model %s", id)
	}
	return torch.Do(func() error { return p.Save(dir) })
}

// testLauncher runs this test binary as the drmas CLI (TestMain), as managed replicas need.
func testLauncher(args []string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), "DRMAS_TEST_CLI=1")
	return cmd
}

// A model whose rollouts are on a managed replica: drmas train starts a drmas serve process itself
// (loopback, a key of its own, weights from the run folder), trains as the local engine does on a
// float64 toy model, and when the replica is killed mid-run, restarts it from the weights it served,
// counts the restart and completes the run with the same metrics and weights; the replica stops with
// the run.
func TestManagedReplicaRestarted(t *testing.T) {
	const steps = "run.steps=6"
	local := t.TempDir()
	if err := runTraining(t, toyTeam(t, local, "float64", steps), false); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := toyTeam(t, dir, "float64", steps, "models.0.rollout={engine: managed, replicas: 1, threads: 1}")
	pidFile := filepath.Join(dir, engine.ReplicasDir, "small-0.pid")
	killed := make(chan int, 1)
	go func() { // kill the replica once the first iteration is recorded
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if countLines(filepath.Join(dir, rundir.MetricsFile)) < 1 {
				continue
			}
			b, err := os.ReadFile(pidFile)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid == 0 {
				continue
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed <- pid
			return
		}
		close(killed)
	}()
	tr, err := train.New(context.Background(), cfg, train.Options{Device: "cpu", Launch: testLauncher})
	if err != nil {
		t.Fatal(err)
	}
	err = tr.Run(context.Background())
	tr.Close()
	if err != nil {
		t.Fatal(err)
	}
	pid, ok := <-killed
	if !ok {
		t.Fatal("the replica was never killed")
	}
	restarts := column(t, dir, "rollout/restarts/small")
	if len(restarts) != 6 || restarts[5] < 1 {
		t.Fatalf("rollout/restarts/small = %v, want a restart counted", restarts)
	}
	if worst, same := maxDiff(t, local, dir, 6); worst > 1e-9 || !same {
		t.Errorf("the managed run differs from the local one: metric diff %g, same weights %v", worst, same)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("the killed replica's process %d is alive", pid)
	}
	b, err := os.ReadFile(pidFile)
	if err == nil {
		if p, _ := strconv.Atoi(strings.TrimSpace(string(b))); p != 0 && syscall.Kill(p, 0) == nil {
			t.Errorf("the restarted replica (pid %d) outlived the run", p)
		}
	}
}
