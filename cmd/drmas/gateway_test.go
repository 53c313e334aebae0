package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/drmas/drmas/pkg/gateway/mathrunner"
)

// The gateway end to end: `drmas train` on a team whose runner is written outside drmas.

// freeRunnerURL is a loopback URL nothing listens on yet, for a runner to take.
func freeRunnerURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}

// readLines reads a JSONL file's lines as JSON objects.
func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, v)
	}
	return out
}

// nodePackage finds node and an npm package installed by a set-up script (env names the folder,
// else dflt), or skips the test saying how to get them.
func nodePackage(t *testing.T, env, dflt, pkg, script string) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node not found: this test runs a Node runner (Node.js and %s)", script)
	}
	dir = os.Getenv(env)
	if dir == "" {
		dir = dflt
	}
	abs, _ := filepath.Abs(dir)
	if _, err := os.Stat(filepath.Join(abs, "node_modules", pkg, "package.json")); err != nil {
		t.Skipf("%s is not installed in %s: run %s (make test does)", pkg, abs, script)
	}
	return node, abs
}

// loggedEpisode is one episode as the Node runner logged it: its calls' answers in order, its reply.
type loggedEpisode struct {
	id     string
	agents []string
	texts  []string
	reward float64
}

// runnerEpisodes reads DRMAS_RUNNER_LOG of cmd/drmas/testdata/logged-runner.mjs: the episodes in the
// order they were answered, and the key checks' statuses.
func runnerEpisodes(t *testing.T, path string) ([]loggedEpisode, map[string]float64) {
	t.Helper()
	open := map[string]*loggedEpisode{}
	var eps []loggedEpisode
	checks := map[string]float64{}
	for _, l := range readLines(t, path) {
		if c, ok := l["check"].(string); ok {
			checks[c], _ = l["status"].(float64)
			continue
		}
		id := l["episode_id"].(string)
		e := open[id]
		if e == nil {
			e = &loggedEpisode{id: id}
			open[id] = e
		}
		if r, ok := l["reply"].(map[string]any); ok {
			e.reward = r["reward"].(float64)
			eps = append(eps, *e)
			delete(open, id)
			continue
		}
		text, _ := l["content"].(string)
		e.agents, e.texts = append(e.agents, l["agent"].(string)), append(e.texts, text)
	}
	return eps, checks
}

// A team written against the official OpenAI Node SDK (examples/typescript/runner.mjs) trains 3
// iterations through the gateway: every answer the SDK received is a call of the iteration's rollout
// dump (same episode, agent, text, order), the dumps hold nothing else, the mean of the runner's
// rewards is the logged reward/mean, both agents' calls are counted per agent, and requests without
// the episode's key (or with another) get 401.
func TestGatewayOpenAINodeSDK(t *testing.T) {
	node, sdk := nodePackage(t, "DRMAS_OPENAI_NODE", "../../.cache/openai-node", "openai", "scripts/openai-node.sh")
	run, logPath := t.TempDir(), filepath.Join(t.TempDir(), "runner.jsonl")
	const steps, batch, group = 3, 4, 4
	runner := `{url: "` + freeRunnerURL(t) + `", command: "` + node + `", args: [testdata/logged-runner.mjs], env: {NODE_PATH: "` +
		filepath.Join(sdk, "node_modules") + `", DRMAS_RUNNER_LOG: "` + logPath + `"}}`
	if _, stderr, err := execDrmas(t, "train", "--config", "../../examples/typescript/team.yaml", "--set", "run.dir="+run,
		"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json", "--set", "run.steps=3", "--set", "run.dump_every=1",
		"--set", "run.test_freq=0", "--set", "run.save_every=3", "--set", "algorithm.batch_size=4", "--set", "algorithm.group_size=4",
		"--set", "orchestra.runner="+runner); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	eps, checks := runnerEpisodes(t, logPath)
	if checks["keyless"] != 401 || checks["wrong_key"] != 401 {
		t.Errorf("key checks %v: want 401 without the key and with a wrong one", checks)
	}
	if rewarded := checkIterations(t, run, eps, steps, batch*group); rewarded == 0 {
		t.Error("no episode was rewarded: the reward check holds for any run (warm-up too short?)")
	}
}

// checkIterations checks a gateway run against its runner's log (the episodes it answered, in
// order; the training iterations' last, perIteration each): every answer the runner received is a
// call of its iteration's rollout dump (same episode, agent, text, order, reward) and the dump holds
// nothing else; reward/mean is the mean of the runner's rewards; calls/agent/<a> its calls per
// episode, both agents calling; no episode failed or was retried. It returns the rewards' sum.
func checkIterations(t *testing.T, run string, eps []loggedEpisode, steps, perIteration int) float64 {
	t.Helper()
	metrics := readMetrics(t, run)
	if len(metrics) != steps || len(eps) < steps*perIteration {
		t.Fatalf("%d metrics rows, %d episodes logged", len(metrics), len(eps))
	}
	eps = eps[len(eps)-steps*perIteration:] // the training iterations' (the warm-up's and its evals' come first)
	var rewarded float64
	for it := 1; it <= steps; it++ {
		m, chunk := metrics[it-1], eps[(it-1)*perIteration:it*perIteration]
		dump := map[string][]map[string]any{}
		lines := readLines(t, filepath.Join(run, "rollouts", "step-"+strconv.Itoa(it)+".jsonl"))
		for _, l := range lines {
			dump[l["traj_uid"].(string)] = append(dump[l["traj_uid"].(string)], l)
		}
		var reward float64
		calls, perAgent := 0, map[string]float64{}
		for _, e := range chunk {
			d := dump[e.id]
			if len(d) != len(e.texts) {
				t.Fatalf("iteration %d, episode %s: the runner received %d answers, the dump has %d calls", it, e.id, len(e.texts), len(d))
			}
			for k := range d {
				if d[k]["agent"] != e.agents[k] || d[k]["response"] != e.texts[k] || d[k]["reward"].(float64) != e.reward {
					t.Errorf("iteration %d, episode %s, call %d: runner got %s %q (reward %g), dump has %v %q (reward %v)",
						it, e.id, k, e.agents[k], e.texts[k], e.reward, d[k]["agent"], d[k]["response"], d[k]["reward"])
				}
				perAgent[e.agents[k]]++
			}
			calls += len(d)
			reward += e.reward
		}
		rewarded += reward
		if calls != len(lines) {
			t.Errorf("iteration %d: the dump has %d calls, the runner received %d answers", it, len(lines), calls)
		}
		if got, want := m["reward/mean"], reward/float64(len(chunk)); math.Abs(got-want) > 1e-12 {
			t.Errorf("iteration %d: reward/mean %g, the runner's rewards average %g", it, got, want)
		}
		for _, a := range []string{"solver", "verifier"} {
			if got, want := m["calls/agent/"+a], perAgent[a]/float64(len(chunk)); perAgent[a] == 0 || math.Abs(got-want) > 1e-12 {
				t.Errorf("iteration %d: calls/agent/%s %g, the runner made %g per episode", it, a, got, want)
			}
		}
		if m["rollout/gateway/failed_episodes"] != 0 || m["rollout/gateway/retried_episodes"] != 0 {
			t.Errorf("iteration %d: failed %g, retried %g episodes", it, m["rollout/gateway/failed_episodes"], m["rollout/gateway/retried_episodes"])
		}
	}
	return rewarded
}

// keysBut is a metrics row without the keys a gateway run may differ in: timings, process figures and
// the gateway's own counters.
func keysBut(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if !strings.HasPrefix(k, "time/") && !strings.HasPrefix(k, "perf/") && !strings.HasPrefix(k, "rollout/gateway/") {
			out[k] = v
		}
	}
	return out
}

// The toy math team trained as its built-in orchestra and as a gateway runner that makes the same
// calls (pkg/gateway/mathrunner, over HTTP) gives the same run, float32 on the CPU, the format warm-up
// (its demonstrations played through the runner), validation and 2 iterations included: every call of
// the rollout dumps (agent, prompt, rendered prompt, response, token counts, validity, score, reward)
// and every metric but timings are equal, and the weights are equal byte for byte.
func TestGatewayMatchesBuiltin(t *testing.T) {
	srv := &http.Server{Handler: mathrunner.Runner{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	short := []string{"--config", "../../configs/toy-math.yaml", "--set", "models.0.tokenizer=../../configs/toy/tokenizer.json",
		"--set", "run.steps=2", "--set", "run.save_every=2", "--set", "run.test_freq=2", "--set", "run.val_limit=16",
		"--set", "run.dump_every=1", "--set", "run.max_minutes=0", "--set", "warmup.steps=20"}
	runs := map[string]string{"builtin": t.TempDir(), "gateway": t.TempDir()}
	for name, dir := range runs {
		args := append([]string{"train", "--set", "run.dir=" + dir}, short...)
		if name == "gateway" {
			args = append(args, "--set", `orchestra={type: gateway, runner: {url: "http://`+ln.Addr().String()+`", concurrency: 256}}`)
		}
		if _, stderr, err := execDrmas(t, args...); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, stderr)
		}
	}
	b, g := readMetrics(t, runs["builtin"]), readMetrics(t, runs["gateway"])
	if len(b) != 2 || len(g) != 2 {
		t.Fatalf("%d and %d metrics rows", len(b), len(g))
	}
	for i := range b {
		mb, mg := keysBut(b[i]), keysBut(g[i])
		for k, v := range mb {
			if w, ok := mg[k]; !ok || !(v == w || math.IsNaN(v) && math.IsNaN(w)) {
				t.Errorf("step %d %s: built-in %v, gateway %v", i+1, k, v, w)
			}
		}
		if len(mb) != len(mg) {
			t.Errorf("step %d: %d metrics built in, %d through the gateway", i+1, len(mb), len(mg))
		}
	}
	for it := 1; it <= 2; it++ {
		lb := readLines(t, filepath.Join(runs["builtin"], "rollouts", "step-"+strconv.Itoa(it)+".jsonl"))
		lg := readLines(t, filepath.Join(runs["gateway"], "rollouts", "step-"+strconv.Itoa(it)+".jsonl"))
		if len(lb) != len(lg) || len(lb) == 0 {
			t.Fatalf("step %d: %d calls built in, %d through the gateway", it, len(lb), len(lg))
		}
		invalid := 0
		for k := range lb {
			for _, f := range []string{"traj_uid", "agent", "prompt", "rendered_prompt", "response", "prompt_tokens", "response_tokens", "valid", "score", "reward", "success", "finish"} {
				if lb[k][f] != lg[k][f] {
					t.Fatalf("step %d call %d: %s %v built in, %v through the gateway", it, k, f, lb[k][f], lg[k][f])
				}
			}
			if lb[k]["valid"] == false {
				invalid++
			}
		}
		if invalid == 0 {
			t.Errorf("step %d: no invalid call: the runner's notes on calls went unchecked", it)
		}
	}
	for _, f := range []string{"step-2/small/model.safetensors", "step-2/small/optim.safetensors"} {
		wb, _ := os.ReadFile(filepath.Join(runs["builtin"], f))
		wg, _ := os.ReadFile(filepath.Join(runs["gateway"], f))
		if len(wb) == 0 || !slices.Equal(wb, wg) {
			t.Errorf("%s differs (%d and %d bytes)", f, len(wb), len(wg))
		}
	}
}

// dyingRunner is a gateway runner process (the math team, pkg/gateway/mathrunner) that dies for good:
// at its DRMAS_TEST_RUNNER_DIE_AT-th episode it exits mid-episode, leaving a file "died" in dir, and
// started again while that file is there it exits at once.
func dyingRunner(dir string) {
	if _, err := os.Stat(filepath.Join(dir, "died")); err == nil {
		os.Exit(3)
	}
	dieAt, _ := strconv.Atoi(os.Getenv("DRMAS_TEST_RUNNER_DIE_AT"))
	var mu sync.Mutex
	n := 0
	play := mathrunner.Runner{}
	u, _ := url.Parse(os.Getenv("DRMAS_RUNNER_URL"))
	err := http.ListenAndServe(u.Host, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		if n == dieAt {
			_ = os.WriteFile(filepath.Join(dir, "died"), nil, 0o644)
			os.Exit(3)
		}
		mu.Unlock()
		play.ServeHTTP(w, r)
	}))
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// A runner drmas started that dies mid-run and cannot come back: the run stops within
// runner.start_timeout with an error naming the runner's URL, and the run folder is as the last
// iteration left it — metrics.jsonl whole, the checkpoints readable: the run resumes from its latest
// with a runner that works and finishes.
func TestGatewayRunnerDiesRunIntact(t *testing.T) {
	run, dir, u := t.TempDir(), t.TempDir(), freeRunnerURL(t)
	base := []string{"--config", "../../configs/toy-math.yaml", "--set", "models.0.tokenizer=../../configs/toy/tokenizer.json",
		"--set", "run.dir=" + run, "--set", "run.steps=4", "--set", "run.save_every=1", "--set", "run.keep_last=4", "--set", "run.test_freq=0",
		"--set", "run.max_minutes=0", "--set", "warmup.steps=0", "--set", "algorithm.batch_size=4", "--set", "algorithm.group_size=2"}
	dying := `orchestra={type: gateway, runner: {url: "` + u + `", command: "` + os.Args[0] + `", start_timeout: 3s,
		env: {DRMAS_TEST_RUNNER: "` + dir + `", DRMAS_TEST_RUNNER_DIE_AT: "19"}}}` // 8 episodes an iteration: dies in the third
	_, stderr, err := execDrmas(t, append([]string{"train", "--set", dying}, base...)...)
	if err == nil || !strings.Contains(err.Error(), "runner unreachable") || !strings.Contains(err.Error(), u) {
		t.Fatalf("train with a runner that died: err = %v, want the runner unreachable naming %s\n%s", err, u, stderr)
	}
	if m := readMetrics(t, run); len(m) != 2 || m[0]["step"] != 1 || m[1]["step"] != 2 {
		t.Fatalf("metrics.jsonl after the runner died: %d rows %v, want steps 1 and 2", len(m), m)
	}
	srv := &http.Server{Handler: mathrunner.Runner{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	working := `orchestra={type: gateway, runner: {url: "http://` + ln.Addr().String() + `"}}`
	if _, stderr, err := execDrmas(t, append([]string{"train", "--resume", "--set", working}, base...)...); err != nil {
		t.Fatalf("resume with a working runner: %v\n%s", err, stderr)
	}
	m := readMetrics(t, run)
	if len(m) != 4 || m[2]["step"] != 3 || m[3]["step"] != 4 {
		t.Fatalf("after the resume: %d metrics rows, want steps 1–4", len(m))
	}
}

// A team written with the OpenAI Agents SDK (examples/agents-sdk/runner.mjs: a Solver with a function
// tool, a Verifier, Chat Completions, tracing off) trains 2 iterations through the gateway: the
// Solver's requests offer its tool (the SDK's tools reach the endpoint), the Verifier's none; every
// answer the SDK got is in the rollout dumps, reward/mean is the runner's mean, both agents counted.
func TestGatewayAgentsSDK(t *testing.T) {
	node, sdk := nodePackage(t, "DRMAS_OPENAI_AGENTS", "../../.cache/openai-agents", "@openai/agents", "scripts/openai-agents.sh")
	run, logPath := t.TempDir(), filepath.Join(t.TempDir(), "runner.jsonl")
	const steps, batch, group = 2, 4, 4
	runner := `{url: "` + freeRunnerURL(t) + `", command: "` + node + `", args: [testdata/logged-agents-runner.mjs], env: {NODE_PATH: "` +
		filepath.Join(sdk, "node_modules") + `", DRMAS_RUNNER_LOG: "` + logPath + `"}}`
	if _, stderr, err := execDrmas(t, "train", "--config", "../../examples/agents-sdk/team.yaml", "--set", "run.dir="+run,
		"--set", "models.0.tokenizer=../../configs/toy/tokenizer.json", "--set", "run.steps=2", "--set", "run.dump_every=1",
		"--set", "run.test_freq=0", "--set", "run.save_every=2", "--set", "algorithm.batch_size=4", "--set", "algorithm.group_size=4",
		"--set", "orchestra.runner="+runner); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	for _, l := range readLines(t, logPath) {
		tools, agent := fmt.Sprint(l["tools"]), l["agent"]
		if agent == "solver" && tools != "[add]" || agent == "verifier" && tools != "[]" {
			t.Fatalf("%s's request offered tools %s: want [add] for the solver, none for the verifier", agent, tools)
		}
	}
	eps, _ := runnerEpisodes(t, logPath)
	checkIterations(t, run, eps, steps, batch*group)
}
