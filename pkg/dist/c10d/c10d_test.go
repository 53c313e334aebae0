package c10d

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/dist"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

func TestNilGroupIsSingleProcess(t *testing.T) {
	var g *Group
	v := []float64{1, 2}
	if err := g.AllReduceFloats(v, Sum); err != nil || v[0] != 1 || g.Size() != 1 || g.Rank() != 0 {
		t.Fatalf("nil group: %v %v", v, err)
	}
	out, err := g.AllGatherBytes([]byte("x"))
	if err != nil || len(out) != 1 || string(out[0]) != "x" {
		t.Fatalf("nil group gather: %q %v", out, err)
	}
}

// The worker side of the multi-process tests: the test binary re-executed with DIST_TEST_MODE set.
func TestMain(m *testing.M) {
	if mode := os.Getenv("DIST_TEST_MODE"); mode != "" {
		if err := worker(mode); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func worker(mode string) error {
	e, _, err := dist.EnvFromOS()
	if err != nil {
		return err
	}
	switch mode {
	case "sleep": // a worker that only waits to be killed, after saying who it is
		if err := os.WriteFile(filepath.Join(os.Getenv("DIST_TEST_DIR"), fmt.Sprintf("pid-%d", e.Rank)), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return err
		}
		time.Sleep(2 * time.Minute)
		return errors.New("still alive after 2 minutes")
	case "launch": // a launcher of sleeping workers
		return dist.Launch(context.Background(), dist.LaunchOptions{N: 2, Program: os.Args[0], Args: []string{"-test.run=^$"}, Env: []string{"DIST_TEST_MODE=sleep"}})
	}
	// The identity every rank must share; in mode differ rank 1 has another value of one key.
	id := map[string]string{"drmas.version": "test", "run.steps": "3", "models.0.optim.lr": "0.001"}
	if mode == "differ" && e.Rank == 1 {
		id["models.0.optim.lr"] = "0.002"
	}
	g, err := Init(e, Options{Backend: os.Getenv("DIST_TEST_BACKEND"), Timeout: 20 * time.Second, Heartbeat: 200 * time.Millisecond, Stall: 3 * time.Second, Identity: id})
	if mode == "differ" {
		if errors.Is(err, ErrMismatch) {
			fmt.Fprintln(os.Stderr, "REFUSED:", err)
			os.Exit(5)
		}
		return fmt.Errorf("different identities: want a mismatch, got %v", err)
	}
	if err != nil {
		return err
	}
	r, w := float64(g.Rank()), float64(g.Size())
	// all-reduce: sum, max, min of rank-dependent values
	v := []float64{r + 1, r, -r}
	if err := g.AllReduceFloats(v, Sum); err != nil {
		return err
	}
	if v[0] != w*(w+1)/2 || v[1] != w*(w-1)/2 {
		return fmt.Errorf("sum: %v", v)
	}
	mx := []float64{r}
	if err := g.AllReduceFloats(mx, Max); err != nil || mx[0] != w-1 {
		return fmt.Errorf("max: %v %v", mx, err)
	}
	if mode == "die" {
		if g.Rank() == 1 {
			os.Exit(3) // a crash mid-run
		}
		time.Sleep(300 * time.Millisecond)
		began := time.Now()
		err := g.AllReduceFloats(v, Sum)
		if err == nil {
			return errors.New("all-reduce with a dead peer succeeded")
		}
		fmt.Fprintf(os.Stderr, "DETECTED after %s: %v\n", time.Since(began).Round(time.Millisecond), err)
		os.Exit(7)
	}
	if mode == "stop0" {
		if g.Rank() == 0 {
			// The store's host stops (SIGSTOP): its store, heartbeats and collectives all go silent.
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			time.Sleep(time.Minute)
			os.Exit(0)
		}
		_ = g.AllReduceFloats(v, Sum) // blocks until the watchdog names the silent host and exits
		return errors.New("all-reduce with a stopped rank 0 returned")
	}
	if mode == "slowsave" {
		if g.Rank() == 0 {
			time.Sleep(5 * time.Second) // the last checkpoint takes longer than the stall bound (3 s)
		}
		return g.Close() // rank 1 waits in the closing barrier, still beating
	}
	if mode == "hang" {
		if g.Rank() == 1 {
			// A hung rank: connections open but silent (a stopped process looks the same).
			close(g.stop)
			<-g.done
			time.Sleep(5 * time.Second)
			os.Exit(0)
		}
		_ = g.AllReduceFloats(v, Sum) // blocks until the monitor names the silent rank and exits
		return errors.New("all-reduce with a hung peer returned")
	}
	// broadcast: rank 0's weights reach everyone; Verify agrees afterwards and not before.
	x := ts.MustOfSlice([]float32{float32(r), float32(r) + 0.5, 7}).MustView([]int64{3}, true).MustTo(g.device(), true)
	if g.Size() > 1 {
		if err := g.Verify([]string{"x"}, []*ts.Tensor{x}); err == nil {
			return errors.New("verify passed on different tensors")
		}
	}
	if err := g.Broadcast([]*ts.Tensor{x}, 0); err != nil {
		return err
	}
	got := x.MustTo(gotch.CPU, false).Float64Values()
	if got[0] != 0 || got[1] != 0.5 || got[2] != 7 {
		return fmt.Errorf("broadcast: %v", got)
	}
	if err := g.Verify([]string{"x"}, []*ts.Tensor{x}); err != nil {
		return err
	}
	// all-gather of payloads of different lengths
	parts, err := g.AllGatherBytes(bytes.Repeat([]byte{byte('a' + g.Rank())}, g.Rank()*3+1))
	if err != nil {
		return err
	}
	for i, p := range parts {
		if string(p) != strings.Repeat(string(rune('a'+i)), i*3+1) {
			return fmt.Errorf("gather part %d: %q", i, p)
		}
	}
	if err := flatCollectives(g); err != nil {
		return err
	}
	if g.CommTime() <= 0 {
		return errors.New("no communication time measured")
	}
	return g.Close()
}

// flatCollectives checks parameter sharding's collectives: every rank's part gathered into a flat
// buffer in rank order, and a flat buffer summed over the ranks with each rank keeping its part.
func flatCollectives(g *Group) error {
	r, w := float32(g.Rank()), g.Size()
	shard := ts.MustOfSlice([]float32{r, r + 0.25}).MustTo(g.device(), true)
	flat := ts.MustZeros([]int64{2 * int64(w)}, gotch.Float, g.device())
	if err := g.AllGatherInto(flat, shard); err != nil {
		return err
	}
	got := flat.MustTo(gotch.CPU, false).Float64Values()
	for i := 0; i < w; i++ {
		if got[2*i] != float64(i) || got[2*i+1] != float64(i)+0.25 {
			return fmt.Errorf("all-gather into a flat buffer: %v", got)
		}
	}
	vals := make([]float32, 2*w)
	for k := range vals {
		vals[k] = r + float32(k)
	}
	mine, err := g.ReduceScatter(ts.MustOfSlice(vals).MustTo(g.device(), true))
	if err != nil {
		return err
	}
	got = mine.MustTo(gotch.CPU, false).Float64Values()
	for j, v := range got {
		k := 2*g.Rank() + j
		if want := float64(w*(w-1)/2 + w*k); v != want {
			return fmt.Errorf("reduce-scatter: rank %d's part %v, want %g at %d", g.Rank(), got, want, j)
		}
	}
	return nil
}

func self(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestLaunchCollectives starts 3 Gloo ranks through dist.Launch and checks every collective in them.
func TestLaunchCollectives(t *testing.T) {
	err := dist.Launch(context.Background(), dist.LaunchOptions{N: 3, Program: self(t), Args: []string{"-test.run=^$"}, Env: []string{"DIST_TEST_MODE=ok"}})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLaunchReportsFailedRank(t *testing.T) {
	err := dist.Launch(context.Background(), dist.LaunchOptions{N: 2, Program: self(t), Args: []string{"-test.run=^$"}, Env: []string{"DIST_TEST_MODE=die"}, Grace: 5 * time.Second})
	var ee *dist.ExitError
	if !errors.As(err, &ee) || ee.Rank != 1 || ee.Code != 3 {
		t.Fatalf("want rank 1's exit 3, got %v", err)
	}
}

// start runs the ranks of one group directly (as torchrun would) and returns each one's exit code and stderr.
func start(t *testing.T, mode string, n int) ([]int, []string, time.Duration) {
	port, err := dist.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return startAt(t, mode, dist.Env{WorldSize: n, MasterAddr: "127.0.0.1", MasterPort: port})
}

// startAt runs ranks 0..WorldSize−1 of the launch environment base.
func startAt(t *testing.T, mode string, base dist.Env) ([]int, []string, time.Duration) {
	n := base.WorldSize
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	for r := range cmds {
		e := base
		e.Rank, e.LocalRank = r, r
		cmds[r] = exec.Command(self(t), "-test.run=^$")
		cmds[r].Env = append(append(dist.WithoutLaunchVars(os.Environ()), "DIST_TEST_MODE="+mode), e.Vars()...)
		outs[r] = &bytes.Buffer{}
		cmds[r].Stderr = outs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	codes := make([]int, n)
	logs := make([]string, n)
	for r, c := range cmds {
		_ = c.Wait()
		codes[r] = c.ProcessState.ExitCode()
		logs[r] = outs[r].String()
	}
	return codes, logs, time.Since(began)
}

func TestDeadRankIsNamed(t *testing.T) {
	codes, logs, took := start(t, "die", 2)
	if codes[1] != 3 || codes[0] != 7 {
		t.Fatalf("exit codes %v; rank 0 said:\n%s", codes, logs[0])
	}
	if !strings.Contains(logs[0], "rank 1 stopped responding") {
		t.Fatalf("rank 0 did not name rank 1:\n%s", logs[0])
	}
	if took > 15*time.Second {
		t.Fatalf("detection took %s", took)
	}
}

// TestLaunchBlamesStoppedStoreHost stops rank 0, the store's host, with SIGSTOP: rank 1 must notice
// within the stall bound (3 s here) though no store call answers, and dist.Launch must blame rank 0, not
// rank 1 that exited first, and kill it at once (a stopped rank ignores the SIGTERM of the grace
// period, a minute here).
func TestLaunchBlamesStoppedStoreHost(t *testing.T) {
	began := time.Now()
	err := dist.Launch(context.Background(), dist.LaunchOptions{N: 2, Program: self(t), Args: []string{"-test.run=^$"}, Env: []string{"DIST_TEST_MODE=stop0"}, Grace: time.Minute})
	took := time.Since(began)
	var ee *dist.ExitError
	if !errors.As(err, &ee) || ee.Rank != 0 || ee.ReportedBy != 1 {
		t.Fatalf("want rank 0 blamed by rank 1, got %v", err)
	}
	if !strings.Contains(err.Error(), "rank 0 hung or died") || !strings.Contains(err.Error(), "serves the rendezvous store") {
		t.Fatalf("error does not name the stopped host: %v", err)
	}
	if took > 30*time.Second {
		t.Fatalf("detection and exit took %s (stall bound 3 s, grace 1 min)", took)
	}
	t.Logf("%s: %v", took.Round(time.Millisecond), err)
}

// TestLauncherDeathKillsWorkers kills a launcher (SIGKILL, nothing it can catch): its workers must
// not outlive it.
func TestLauncherDeathKillsWorkers(t *testing.T) {
	dir := t.TempDir()
	launcher := exec.Command(self(t), "-test.run=^$")
	launcher.Env = append(dist.WithoutLaunchVars(os.Environ()), "DIST_TEST_MODE=launch", "DIST_TEST_DIR="+dir)
	if err := launcher.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = launcher.Process.Kill(); _ = launcher.Wait() }()
	pids := make([]int, 2)
	deadline := time.Now().Add(20 * time.Second)
	for r := range pids {
		for pids[r] == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("worker %d did not start", r)
			}
			if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("pid-%d", r))); err == nil && len(b) > 0 {
				pids[r], _ = strconv.Atoi(string(b))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	_ = launcher.Process.Signal(syscall.SIGKILL)
	_ = launcher.Wait()
	killed := time.Now()
	for _, pid := range pids {
		for alive(pid) {
			if time.Since(killed) > 10*time.Second {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("worker %d still running 10 s after its launcher was killed", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Logf("workers %v gone %s after the launcher", pids, time.Since(killed).Round(time.Millisecond))
}

// alive reports whether pid is a running process (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestDifferentConfigsAreRefused: two ranks whose identities differ in one key both refuse to start,
// naming the key and both values.
func TestDifferentConfigsAreRefused(t *testing.T) {
	codes, logs, _ := start(t, "differ", 2)
	for r := range codes {
		if codes[r] != 5 || !strings.Contains(logs[r], `models.0.optim.lr: "0.00`) || strings.Contains(logs[r], "run.steps") {
			t.Fatalf("rank %d: exit %d, want 5 naming models.0.optim.lr alone:\n%s", r, codes[r], logs[r])
		}
	}
	t.Logf("rank 0: %s", strings.TrimSpace(logs[0]))
}

// TestStoreAdmitsLoopbackOnly: a store served for MASTER_ADDR=127.0.0.1 is bound to the loopback
// device (TCPStore itself listens on every interface).
func TestStoreAdmitsLoopbackOnly(t *testing.T) {
	port, err := dist.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	g, err := Init(dist.Env{WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: port}, Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	fds := storeSockets(port)
	if len(fds) == 0 {
		t.Fatalf("no listening socket on port %d in this process", port)
	}
	for _, fd := range fds {
		if d := boundDevice(fd); d != "lo" {
			t.Fatalf("store socket (fd %d) bound to device %q, want lo", fd, d)
		}
	}
}

// TestSlowLastSaveIsNoHang: rank 0 spends longer than the stall bound before Close (writing the
// last checkpoint) while rank 1 is already closing; rank 1 keeps beating in the closing barrier, so
// neither is taken for hung (before, rank 1 stopped its monitor first and rank 0 exited 1 naming it).
func TestSlowLastSaveIsNoHang(t *testing.T) {
	codes, logs, _ := start(t, "slowsave", 2)
	if codes[0] != 0 || codes[1] != 0 {
		t.Fatalf("exit codes %v; rank 0 said:\n%s\nrank 1 said:\n%s", codes, logs[0], logs[1])
	}
}

func TestHungRankIsNamed(t *testing.T) {
	codes, logs, took := start(t, "hang", 2)
	if codes[0] != 1 || !strings.Contains(logs[0], "rank 1 stopped responding") {
		t.Fatalf("exit codes %v; rank 0 said:\n%s", codes, logs[0])
	}
	if took > 20*time.Second {
		t.Fatalf("detection took %s", took)
	}
}

// TestAgentStore is torchrun's layout: its agent already serves the store at MASTER_ADDR:MASTER_PORT
// and tells the workers so (TORCHELASTIC_USE_AGENT_STORE=True). This test process plays the agent (a
// group of its own serves the store); the workers must join it as clients, with keys of their own.
func TestAgentStore(t *testing.T) {
	port, err := dist.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	agent, err := Init(dist.Env{WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: port}, Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	base := dist.Env{WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port, AgentStore: true, Attempt: 1}
	codes, logs, _ := startAt(t, "ok", base)
	if codes[0] != 0 || codes[1] != 0 {
		t.Fatalf("workers on the agent's store: exit codes %v\nrank 0: %s\nrank 1: %s", codes, logs[0], logs[1])
	}
	// Without the agent flag rank 0 tries to serve the store itself, on a port the agent holds.
	base.AgentStore, base.WorldSize = false, 1
	codes, logs, _ = startAt(t, "ok", base)
	if codes[0] == 0 || !strings.Contains(logs[0], "127.0.0.1:"+strconv.Itoa(port)) {
		t.Fatalf("rank 0 served a second store on the agent's port: exit codes %v\n%s", codes, logs[0])
	}
}

func TestRendezvousErrorNamesAddress(t *testing.T) {
	port, err := dist.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// Rank 1 of 2 with nobody serving the store.
	_, err = Init(dist.Env{Rank: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port}, Options{Timeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) {
		t.Fatalf("want an error naming 127.0.0.1:%d, got %v", port, err)
	}
}

// A rendezvous that fails says which rank, which address and port, after how long of which timeout,
// and what to check, both for a rank joining a store nobody serves and for rank 0 serving one nobody
// joins (before: one terse line, "… failed after 2.03s: Socket Timeout").
func TestRendezvousErrorSaysWhatToCheck(t *testing.T) {
	port, err := dist.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := strconv.Itoa(port)
	for _, tc := range []struct {
		env  dist.Env
		says []string
	}{
		{dist.Env{Rank: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port},
			[]string{"rank 1 of 2", "127.0.0.1:" + p, "MASTER_PORT " + p, "of the 2s timeout", "could not join the store rank 0", "dist.timeout_s", "reachable"}},
		{dist.Env{Rank: 0, WorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: port},
			[]string{"rank 0 of 3", "127.0.0.1:" + p, "of the 2s timeout", "the other 2 rank(s) did not all join", "WORLD_SIZE=3", "port " + p + " was free", "dist.timeout_s"}},
	} {
		_, err := Init(tc.env, Options{Timeout: 2 * time.Second})
		if err == nil {
			t.Fatalf("%+v: rendezvous formed", tc.env)
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("rank %d: %q does not say %q", tc.env.Rank, err, s)
			}
		}
	}
}

func TestChecksumSeesOneBit(t *testing.T) {
	a := ts.MustOfSlice([]float32{1, 2, 3})
	b := ts.MustOfSlice([]float32{1, 2, 3.0000002})
	if checksum(a) == checksum(b) || checksum(a) != checksum(a.MustTotype(gotch.Double, false)) {
		t.Fatal("checksum")
	}
}

// TestDeviceNCCL runs the collectives on NCCL when DRMAS_TEST_DEVICE=cuda (scripts/device-check.sh):
// world size 1 on one GPU, and 2 ranks when two GPUs are visible.
func TestDeviceNCCL(t *testing.T) {
	if os.Getenv("DRMAS_TEST_DEVICE") != "cuda" {
		t.Skip("set DRMAS_TEST_DEVICE=cuda on a GPU machine")
	}
	if !NCCLAvailable() {
		t.Fatal("this build has no NCCL (see scripts/torchsetup's output)")
	}
	n := 1
	if gotch.CUDA.DeviceCount() >= 2 {
		n = 2
	}
	err := dist.Launch(context.Background(), dist.LaunchOptions{N: n, Program: self(t), Args: []string{"-test.run=^$"},
		Env: []string{"DIST_TEST_MODE=ok", "DIST_TEST_BACKEND=nccl"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NCCL collectives passed with %d rank(s)", n)
}

// BenchmarkChecksum hashes a 16M-element float32 tensor (64 MB: a layer of a 7B model), as
// SyncWeights' check does every parameter at start.
func BenchmarkChecksum(b *testing.B) {
	x := ts.MustOnes([]int64{16 << 20}, gotch.Float, gotch.CPU)
	defer x.MustDrop()
	b.SetBytes(4 << 24)
	for b.Loop() {
		checksum(x)
	}
}
