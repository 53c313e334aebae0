package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/dist"
)

// drmasCmd is the test binary set up to run `drmas args...` as a child process (TestMain in
// serve_test.go); drmas train --nproc in it starts its ranks the same way.
func drmasCmd(t *testing.T, extraEnv []string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"-test.run=^$", "--", "--log-level", "warn", "--log-format", "json", "--device", "cpu"}
	cmd := exec.Command(exe, append(base, args...)...)
	cmd.Env = append(append(cleanEnv(), "DRMAS_TEST_CLI=1"), extraEnv...)
	cmd.Dir = "../.." // the configs name their files relative to the repository root
	return cmd
}

func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DRMAS_TEST_CLI", "DRMAS_LAUNCHED":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// toyRunArgs are a short toy-math run: 3 iterations after a short warm-up, transcripts every iteration.
// The KL penalty is off: its gradient is zero at the first step up to float rounding, and AdamW's
// first steps turn that rounding noise into ±lr updates (the two runs round differently), so with it
// on the weights differ by ~lr and the sampled tokens soon diverge (docs/scale-out.md, data-parallel training).
func toyRunArgs(config, dir string, extra ...string) []string {
	args := []string{"train", "--config", config, "--set", "run.dir=" + dir, "--set", "run.steps=3",
		"--set", "run.save_every=1", "--set", "run.test_freq=0", "--set", "run.dump_every=1",
		"--set", "warmup.steps=4", "--set", "algorithm.batch_size=6", "--set", "algorithm.group_size=4",
		"--set", "run.max_minutes=0", "--set", "algorithm.kl.coef=0"}
	return append(args, extra...)
}

func run(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, tail(errOut.String(), 3000))
	}
	return errOut.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestDataParallelMatchesOneProcess trains toy-math for 3 iterations in one process and as 2 Gloo
// ranks on the same global batch and seeds, for a shared model and for two non-shared models, with
// every dist.shard stage (none, optimizer, gradients), once with the guard on: the logged metrics and
// the final weights agree to float tolerance. The guard case (whose entropy bonus gives step 3 a
// gradient, so the optimizer state resumed matters) then resumes its checkpoints across world sizes
// and shard stages (2 sharded ranks → 1 process and → 2 unsharded ranks, 1 process → 2 sharded
// ranks): each ends equal to the uninterrupted run.
func TestDataParallelMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 4 short runs")
	}
	nonShared := filepath.Join(t.TempDir(), "two-models.yaml")
	b, err := os.ReadFile("../../configs/toy-math.yaml")
	if err != nil {
		t.Fatal(err)
	}
	two := strings.Replace(string(b), "models:\n", "models:\n  - id: checker\n    init: {model_type: qwen2, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, initializer_range: 0.05}\n    tokenizer: configs/toy/tokenizer.json\n    optim: {lr: 1.0e-3, weight_decay: 0.0, grad_clip: 1.0}\n", 1)
	two = strings.Replace(two, "{name: verifier, model: small", "{name: verifier, model: checker", 1)
	if err := os.WriteFile(nonShared, []byte(two), 0o644); err != nil {
		t.Fatal(err)
	}
	// The guard case clips every share above 1.01 × its trailing median: it judges each agent's share of
	// the global gradient, so the ranks must take the one-process decisions (judging their own shares
	// before the all-reduce, they would not, and their weights would part). The entropy bonus gives
	// every step a gradient (these short runs' groups mostly score alike: zero advantages).
	guard := []string{"--set", "algorithm.guard.window=3", "--set", "algorithm.guard.factor=1.01", "--set", "algorithm.guard.action=clip",
		"--set", "algorithm.entropy_coef=0.01"}
	all := []string{"none", "optimizer", "gradients"}
	for _, c := range []struct {
		name, config string
		extra        []string
		stages       []string
		reshard      bool
	}{{"shared", "configs/toy-math.yaml", nil, all, false}, {"non-shared", nonShared, nil, all, false},
		{"non-shared-guard", nonShared, guard, all, true}} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			one := filepath.Join(root, "one")
			run(t, drmasCmd(t, nil, toyRunArgs(c.config, one, c.extra...)...))
			mOne := readMetrics(t, one)
			if len(mOne) != 3 {
				t.Fatalf("metrics lines: %d, want 3", len(mOne))
			}
			if c.extra != nil {
				spikes := 0.0
				for _, m := range mOne {
					for k, v := range m {
						if strings.HasPrefix(k, "guard/agent/") {
							spikes += v
						}
					}
				}
				if spikes == 0 {
					t.Fatal("the guard clipped nothing in 3 iterations: the case tests nothing")
				}
				t.Logf("%s: %g guarded shares", c.name, spikes)
			}
			for _, stage := range c.stages {
				t.Run(stage, func(t *testing.T) {
					two := filepath.Join(root, "two-"+stage)
					run(t, drmasCmd(t, nil, append(toyRunArgs(c.config, two, c.extra...), "--set", "dist.shard="+stage, "--nproc", "2")...))
					sameRun(t, c.name+"/"+stage, one, two, 1)
					a, _ := os.ReadFile(filepath.Join(one, "rollouts", "step-3.jsonl"))
					b, _ := os.ReadFile(filepath.Join(two, "rollouts", "step-3.jsonl"))
					if len(a) == 0 || !bytes.Equal(a, b) {
						t.Errorf("transcripts of step 3 differ (%d vs %d bytes)", len(a), len(b))
					}
					if stage != "none" {
						parts, _ := filepath.Glob(filepath.Join(two, "step-3", "*", "optim.rank-1-of-2.safetensors"))
						models, _ := filepath.Glob(filepath.Join(two, "step-3", "*", "config.json"))
						if len(models) == 0 || len(parts) != len(models) {
							t.Errorf("step-3: %d partitions of rank 1 for %d models", len(parts), len(models))
						}
					}
				})
			}
			if !c.reshard {
				return
			}
			// Resharding: from step-2 of a run, --resume trains step 3 under another world size or
			// shard stage; step 3 must be the uninterrupted run's.
			for _, r := range []struct {
				name, from string
				args       []string
			}{
				{"2 sharded → 1", "two-gradients", nil},
				{"2 sharded → 2 unsharded", "two-optimizer", []string{"--set", "dist.shard=none", "--nproc", "2"}},
				{"1 → 2 sharded", "one", []string{"--set", "dist.shard=gradients", "--nproc", "2"}},
			} {
				t.Run(strings.NewReplacer(" ", "", "→", "-to-").Replace(r.name), func(t *testing.T) {
					if _, err := os.Stat(filepath.Join(root, r.from, "step-2")); err != nil {
						t.Skipf("no run to resume (%v)", err)
					}
					dir := filepath.Join(t.TempDir(), "run")
					copyTree(t, filepath.Join(root, r.from), dir)
					if err := os.RemoveAll(filepath.Join(dir, "step-3")); err != nil {
						t.Fatal(err)
					}
					run(t, drmasCmd(t, nil, append(append(toyRunArgs(c.config, dir, c.extra...), "--resume"), r.args...)...))
					sameRun(t, r.name, one, dir, 3)
				})
			}
		})
	}
}

// TestDataParallelTokenBalanceMatchesOneProcess: with dist.balance: tokens the ranks train on shares
// of equal token count (whole trajectories, not the tasks they rolled out), on a long-tailed batch
// (the solver answers at length, the verifier briefly) cut into micro-batches by a token budget, and
// still match one process (pkg/train's TestTokenSharesBalance shows such shares differ from the
// tasks' shares).
func TestDataParallelTokenBalanceMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 2 short runs")
	}
	extra := []string{"--set", "dist.balance=tokens", "--set", "algorithm.max_tokens_per_micro_batch=48",
		"--set", "agents.0.sampling.max_new_tokens=24", "--set", "algorithm.entropy_coef=0.01"}
	root := t.TempDir()
	one, two := filepath.Join(root, "one"), filepath.Join(root, "two")
	run(t, drmasCmd(t, nil, toyRunArgs("configs/toy-math.yaml", one, extra...)...))
	run(t, drmasCmd(t, nil, append(toyRunArgs("configs/toy-math.yaml", two, extra...), "--nproc", "2")...))
	sameRun(t, "tokens", one, two, 1)
}

// sameRun compares two runs of 3 iterations: the metrics of the steps from `from` on (time and
// perf keys aside) within 1e-5 relative, and step-3's weights within 1e-4.
func sameRun(t *testing.T, name, one, two string, from int) {
	t.Helper()
	mOne, mTwo := readMetrics(t, one), readMetrics(t, two)
	if len(mOne) != 3 || len(mTwo) != 3 {
		t.Fatalf("metrics lines: %d and %d, want 3", len(mOne), len(mTwo))
	}
	worstKey, worst := "", 0.0
	for i := from - 1; i < len(mOne); i++ {
		for k, v := range mOne[i] {
			if strings.HasPrefix(k, "time/") || strings.HasPrefix(k, "perf/") {
				continue
			}
			w, ok := mTwo[i][k]
			if !ok {
				t.Errorf("step %d: metric %s missing in %s", i+1, k, two)
				continue
			}
			if d := relDiff(v, w); d > worst || math.IsNaN(d) {
				worst, worstKey = d, fmt.Sprintf("step %d %s (%g vs %g)", i+1, k, v, w)
			}
		}
	}
	t.Logf("%s: largest metric difference %.3g at %s", name, worst, worstKey)
	if worst > 1e-5 || math.IsNaN(worst) {
		t.Errorf("metrics differ: %s", worstKey)
	}
	wd, where := weightDiff(t, filepath.Join(one, "step-3"), filepath.Join(two, "step-3"))
	t.Logf("%s: largest weight difference %.3g (%s)", name, wd, where)
	if wd > 1e-4 {
		t.Errorf("weights differ by %g at %s", wd, where)
	}
}

// copyTree copies a folder's regular files (a run folder, for a resume that must not touch it).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDataParallelGuardNeedsExactNorms: with dist.agent_norms: approx the ranks only measure their own
// shares, which the guard cannot judge; the run is refused before training (exit 2), naming the key.
func TestDataParallelGuardNeedsExactNorms(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2 ranks")
	}
	args := toyRunArgs("configs/toy-math.yaml", filepath.Join(t.TempDir(), "run"), "--set", "algorithm.guard.window=3",
		"--set", "dist.agent_norms=approx", "--nproc", "2")
	cmd := drmasCmd(t, nil, args...)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Run(); cmd.ProcessState.ExitCode() != 2 || !strings.Contains(errOut.String(), "dist.agent_norms: exact") {
		t.Fatalf("guard with approx norms on 2 ranks: %v, want exit 2 naming dist.agent_norms:\n%s", err, tail(errOut.String(), 1000))
	}
}

// relDiff is |a−b| relative to max(1, |a|).
func relDiff(a, b float64) float64 {
	if math.IsNaN(a) && math.IsNaN(b) {
		return 0
	}
	return math.Abs(a-b) / math.Max(1, math.Abs(a))
}

func readMetrics(t *testing.T, dir string) []map[string]float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var raw map[string]any
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for k, v := range raw {
			switch x := v.(type) {
			case float64:
				m[k] = x
			case nil: // non-finite values are written as null
				m[k] = math.NaN()
			}
		}
		out = append(out, m)
	}
	return out
}

// weightDiff is the largest absolute difference between the float32 tensors of the checkpoints'
// model.safetensors files.
func weightDiff(t *testing.T, a, b string) (float64, string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(a, "*", "*model.safetensors")) // models and LoRA adapters
	if len(files) == 0 {
		t.Fatalf("no model.safetensors under %s", a)
	}
	worst, where := 0.0, ""
	for _, fa := range files {
		rel, _ := filepath.Rel(a, fa)
		ta, tb := readF32(t, fa), readF32(t, filepath.Join(b, rel))
		names := make([]string, 0, len(ta))
		for n := range ta {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			x, y := ta[n], tb[n]
			if len(x) != len(y) {
				t.Fatalf("%s %s: %d vs %d values", rel, n, len(x), len(y))
			}
			for i := range x {
				if d := math.Abs(float64(x[i] - y[i])); d > worst {
					worst, where = d, rel+" "+n
				}
			}
		}
	}
	return worst, where
}

func readF32(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b[:8])
	var header map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	data := b[8+n:]
	out := map[string][]float32{}
	for name, raw := range header {
		var e struct {
			DType   string  `json:"dtype"`
			Offsets []int64 `json:"data_offsets"`
		}
		if name == "__metadata__" || json.Unmarshal(raw, &e) != nil || e.DType != "F32" {
			continue
		}
		seg := data[e.Offsets[0]:e.Offsets[1]]
		v := make([]float32, len(seg)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(seg[4*i:]))
		}
		out[name] = v
	}
	return out
}

// TestKilledRankEndsTheOtherAndResumeContinues kills rank 1 of a torchrun-style launch during an
// iteration: rank 0 must exit non-zero naming rank 1 within the stall bound, the checkpoint left is
// complete, and --resume with 2 ranks finishes the run.
func TestKilledRankEndsTheOtherAndResumeContinues(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	dir := filepath.Join(t.TempDir(), "run")
	port, err := dist.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	args := toyRunArgs("configs/toy-math.yaml", dir, "--set", "run.steps=40", "--set", "dist.stall_s=3")
	cmds := make([]*exec.Cmd, 2)
	logs := make([]*bytes.Buffer, 2)
	for r := range cmds {
		e := dist.Env{Rank: r, WorldSize: 2, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
		cmds[r] = drmasCmd(t, e.Vars(), args...)
		logs[r] = &bytes.Buffer{}
		cmds[r].Stderr = logs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for two iterations to be logged, then kill rank 1 in the middle of the next.
	deadline := time.Now().Add(2 * time.Minute)
	for countLines(filepath.Join(dir, "metrics.jsonl")) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no progress; rank 0:\n%s", tail(logs[0].String(), 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(150 * time.Millisecond)
	killed := time.Now()
	_ = cmds[1].Process.Signal(syscall.SIGKILL)
	_ = cmds[1].Wait()
	done := make(chan error, 1)
	go func() { done <- cmds[0].Wait() }()
	select {
	case err := <-done:
		took := time.Since(killed)
		if err == nil {
			t.Fatalf("rank 0 exited 0 after its peer was killed")
		}
		if !strings.Contains(logs[0].String(), "rank 1 stopped responding") {
			t.Fatalf("rank 0 did not name rank 1:\n%s", tail(logs[0].String(), 2000))
		}
		t.Logf("rank 0 exited (%v) %s after rank 1 was killed", err, took.Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		_ = cmds[0].Process.Kill()
		t.Fatalf("rank 0 still running 30 s after rank 1 was killed:\n%s", tail(logs[0].String(), 2000))
	}
	entries, _ := os.ReadDir(dir)
	last := 0
	for _, e := range entries {
		var s int
		if _, err := fmt.Sscanf(e.Name(), "step-%d", &s); err == nil && !strings.HasSuffix(e.Name(), ".tmp") {
			if _, err := os.Stat(filepath.Join(dir, e.Name(), "trainer.json")); err != nil {
				t.Errorf("%s is incomplete", e.Name())
			}
			last = max(last, s)
		}
	}
	if last < 2 {
		t.Fatalf("latest checkpoint step-%d, want ≥ 2", last)
	}
	// The same world size continues to the end (another one would too: TestDataParallelMatchesOneProcess).
	steps := last + 1
	run(t, drmasCmd(t, nil, append(toyRunArgs("configs/toy-math.yaml", dir, "--set", fmt.Sprintf("run.steps=%d", steps)), "--resume", "--nproc", "2")...))
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("step-%d", steps), "trainer.json")); err != nil {
		t.Fatalf("resume did not reach step %d: %v", steps, err)
	}
}

func countLines(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("\n"))
}

// TestRanksWithDifferentConfigsRefuse starts two ranks torchrun-style, rank 1 with another learning
// rate: both must refuse to start (exit 2) naming the key, before any training.
func TestRanksWithDifferentConfigsRefuse(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2 ranks")
	}
	dir := filepath.Join(t.TempDir(), "run")
	port, err := dist.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cmds := make([]*exec.Cmd, 2)
	logs := make([]*bytes.Buffer, 2)
	for r := range cmds {
		e := dist.Env{Rank: r, WorldSize: 2, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
		args := toyRunArgs("configs/toy-math.yaml", dir)
		if r == 1 {
			args = append(args, "--set", "models.0.optim.lr=0.002")
		}
		cmds[r] = drmasCmd(t, e.Vars(), args...)
		logs[r] = &bytes.Buffer{}
		cmds[r].Stderr = logs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for r, c := range cmds {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = c.Process.Kill()
			t.Fatalf("rank %d still running after 60 s:\n%s", r, tail(logs[r].String(), 2000))
		}
		if code := c.ProcessState.ExitCode(); code != 2 || !strings.Contains(logs[r].String(), "models.0.optim.lr") {
			t.Fatalf("rank %d: exit %d, want 2 naming models.0.optim.lr:\n%s", r, code, tail(logs[r].String(), 2000))
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "metrics.jsonl")); err == nil {
		t.Fatal("the ranks trained before refusing")
	}
	t.Logf("rank 0: %s", strings.TrimSpace(tail(logs[0].String(), 600)))
}

// TestKilledLauncherTakesItsRanks SIGKILLs `drmas train --nproc 2` once it has logged an iteration:
// its ranks must end with it and the run folder must stop changing.
func TestKilledLauncherTakesItsRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	dir := filepath.Join(t.TempDir(), "run")
	launcher, errPath := startLauncher(t, append(toyRunArgs("configs/toy-math.yaml", dir, "--set", "run.steps=100000"), "--nproc", "2")...)
	defer func() { _ = launcher.Process.Kill(); _ = launcher.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for countLines(filepath.Join(dir, "metrics.jsonl")) < 1 {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(errPath)
			t.Fatalf("no progress:\n%s", tail(string(b), 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	ranks := childrenOf(launcher.Process.Pid)
	if len(ranks) != 2 {
		t.Fatalf("launcher %d has %d children, want 2 ranks", launcher.Process.Pid, len(ranks))
	}
	_ = launcher.Process.Signal(syscall.SIGKILL)
	_ = launcher.Wait()
	killed := time.Now()
	for _, pid := range ranks {
		for processAlive(pid) {
			if time.Since(killed) > 10*time.Second {
				for _, p := range ranks {
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
				t.Fatalf("rank (pid %d) still running 10 s after its launcher was killed", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	gone := time.Since(killed)
	lines := countLines(filepath.Join(dir, "metrics.jsonl"))
	time.Sleep(2 * time.Second)
	if n := countLines(filepath.Join(dir, "metrics.jsonl")); n != lines {
		t.Fatalf("metrics.jsonl grew from %d to %d lines after the ranks were gone", lines, n)
	}
	t.Logf("ranks %v gone %s after the launcher's SIGKILL", ranks, gone.Round(time.Millisecond))
}

// TestStoppedRankZeroIsBlamed stops rank 0 of `drmas train --nproc 2` (SIGSTOP: it serves the store,
// so no store call answers any more): rank 1 must notice within dist.stall_s, and the launcher must
// exit 1 with a last line that blames rank 0, not rank 1 that exited first.
func TestStoppedRankZeroIsBlamed(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	dir := filepath.Join(t.TempDir(), "run")
	launcher, errPath := startLauncher(t, append(toyRunArgs("configs/toy-math.yaml", dir, "--set", "run.steps=100000", "--set", "dist.stall_s=3"), "--nproc", "2")...)
	done := make(chan error, 1)
	go func() { done <- launcher.Wait() }()
	var ranks []int
	defer func() {
		for _, pid := range ranks {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for countLines(filepath.Join(dir, "metrics.jsonl")) < 1 {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(errPath)
			t.Fatalf("no progress:\n%s", tail(string(b), 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	ranks = childrenOf(launcher.Process.Pid)
	zero := -1
	for _, pid := range ranks {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if bytes.Contains(append([]byte{0}, env...), []byte("\x00RANK=0\x00")) {
			zero = pid
		}
	}
	if len(ranks) != 2 || zero < 0 {
		t.Fatalf("ranks %v, rank 0 not found among them", ranks)
	}
	stopped := time.Now()
	_ = syscall.Kill(zero, syscall.SIGSTOP)
	select {
	case err := <-done:
		took := time.Since(stopped)
		b, _ := os.ReadFile(errPath)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		last := lines[len(lines)-1]
		if err == nil || launcher.ProcessState.ExitCode() != 1 || !strings.Contains(last, "rank 0 hung or died") || !strings.Contains(last, "reported by rank 1") {
			t.Fatalf("launcher: %v; last line %q, want exit 1 blaming rank 0:\n%s", err, last, tail(string(b), 2000))
		}
		t.Logf("launcher exited %s after SIGSTOP of rank 0: %s", took.Round(time.Millisecond), last)
	case <-time.After(30 * time.Second):
		_ = launcher.Process.Kill()
		b, _ := os.ReadFile(errPath)
		t.Fatalf("launcher still running 30 s after rank 0 was stopped (dist.stall_s=3):\n%s", tail(string(b), 2000))
	}
}

// startLauncher starts drmas with args (a --nproc launch), its stderr going to a file whose path it
// returns: a file, not a pipe, so that Wait does not wait for whoever else holds the launcher's stderr.
func startLauncher(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	launcher := drmasCmd(t, nil, args...)
	errPath := filepath.Join(t.TempDir(), "stderr")
	errOut, err := os.Create(errPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { errOut.Close() })
	launcher.Stderr = errOut
	if err := launcher.Start(); err != nil {
		t.Fatal(err)
	}
	return launcher, errPath
}

// childrenOf lists the running processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		var child int
		if _, err := fmt.Sscanf(e.Name(), "%d", &child); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		var state string
		var ppid int
		if i < 0 {
			continue
		}
		if _, err := fmt.Sscanf(s[i+2:], "%s %d", &state, &ppid); err == nil && ppid == pid && state != "Z" {
			out = append(out, child)
		}
	}
	return out
}

// processAlive reports whether pid runs (not gone, not a zombie).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
