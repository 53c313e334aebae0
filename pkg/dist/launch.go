package dist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog/log"
)

// LaunchOptions describe the local workers Launch starts.
type LaunchOptions struct {
	// N is the number of workers (ranks 0..N−1 on this machine).
	N int
	// Program and Args are the command each worker runs (usually this binary and its own arguments
	// without the launch flag); Env is added to the parent's environment.
	Program string
	Args    []string
	Env     []string
	// Grace is how long the other workers get to stop after one fails, before they are killed (default 10 s).
	Grace time.Duration
}

// ExitError is a worker's failure; Code is its exit status (−1 when a signal ended it). When the
// first rank to fail did so because it lost a peer, Rank is the lost rank (the one to blame) and
// ReportedBy the rank that noticed; otherwise ReportedBy is −1.
type ExitError struct {
	Rank       int
	Code       int
	Err        error
	ReportedBy int
}

func (e *ExitError) Error() string {
	if e.ReportedBy >= 0 {
		return fmt.Sprintf("rank %d hung or died: %v (reported by rank %d)", e.Rank, e.Err, e.ReportedBy)
	}
	return fmt.Sprintf("rank %d failed: %v", e.Rank, e.Err)
}

// Launch runs N workers of one machine the way torchrun does: each gets RANK, LOCAL_RANK, WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, a free MASTER_PORT and, unless set, OMP_NUM_THREADS = cores/N. SIGINT and
// SIGTERM are forwarded to every worker. When a worker fails, the others are stopped (SIGTERM, then
// SIGKILL after the grace period; a rank its peers report hung at once) and the first failure is
// returned, naming its rank, or the rank it reported lost (a rank that noticed a hung peer exits
// first, but the hung one is to blame). Launch returns nil when every worker exits 0.
//
// The workers die with the launcher: each is started with the parent-death signal SIGKILL
// (PR_SET_PDEATHSIG, set in the child between fork and exec). Linux sends it when the thread that
// started the child ends, not the process, so the workers are started from a goroutine locked to
// its thread until Launch returns (the Go runtime ends a thread only when a goroutine exits locked to
// it). A SIGKILL mid-checkpoint is safe: checkpoints are written to a temporary folder and renamed.
func Launch(ctx context.Context, o LaunchOptions) error {
	if o.N < 1 {
		return fmt.Errorf("--nproc %d: want at least 1", o.N)
	}
	if o.Grace <= 0 {
		o.Grace = 10 * time.Second
	}
	port, err := FreePort()
	if err != nil {
		return fmt.Errorf("no free port on 127.0.0.1 for the rendezvous: %w", err)
	}
	reports, err := newReportPipe()
	if err != nil {
		return err
	}
	w := &workers{
		cmds:    make([]*exec.Cmd, o.N),
		exits:   make(chan workerExit, o.N),
		reports: reports,
		release: make(chan struct{}),
	}
	defer close(w.release)
	err = w.start(o, port)
	reports.startReading() // the workers hold the write end now
	if err != nil {
		reports.wait(time.Second)
		return err
	}
	log.Info().Int("nproc", o.N).Int("port", port).Msg("started local workers")
	first := w.supervise(ctx, o.Grace)
	if first == nil {
		return nil
	}
	if first.ReportedBy >= 0 {
		return first
	}
	return w.blame(first)
}

// workerExit is one worker's end: its rank and what Wait returned.
type workerExit struct {
	rank int
	err  error
}

// workers are the local ranks Launch started: their commands, their exits (one Wait per process,
// each in its own goroutine) and the pipe through which a rank reports a peer lost.
type workers struct {
	cmds    []*exec.Cmd
	exits   chan workerExit
	reports *reportPipe
	// release ends the goroutine that started the workers; its thread must live as long as they do.
	release chan struct{}
}

// baseEnv is every worker's environment before its own rank variables: the parent's without its launch
// variables, OMP_NUM_THREADS unless set, and the report pipe's descriptor.
func baseEnv(n int) []string {
	base := WithoutLaunchVars(os.Environ())
	if os.Getenv("OMP_NUM_THREADS") == "" {
		// As torchrun: N ranks share the cores (libtorch's default is one thread per core each).
		base = append(base, "OMP_NUM_THREADS="+strconv.Itoa(max(1, runtime.NumCPU()/n)))
	}
	return append(base, reportFDVar+"=3") // the first of ExtraFiles
}

// start starts every rank from a goroutine locked to its thread (the parent-death signal fires when
// that thread ends) and returns once all are started, or the first start's error after killing and
// reaping the ranks already started.
func (w *workers) start(o LaunchOptions, port int) error {
	base := baseEnv(o.N)
	started := make(chan error)
	go func() {
		// The parent-death signal fires when this thread ends: keep it until Launch returns.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for r := 0; r < o.N; r++ {
			e := Env{Rank: r, WorldSize: o.N, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
			cmd := exec.Command(o.Program, o.Args...)
			cmd.Env = append(append(append([]string{}, base...), o.Env...), e.Vars()...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
			cmd.ExtraFiles = []*os.File{w.reports.w}
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				for _, c := range w.cmds[:r] {
					_ = c.Process.Kill() // its own goroutine (below) reaps it: one Wait per process
				}
				for range w.cmds[:r] {
					<-w.exits
				}
				started <- fmt.Errorf("start rank %d: %w", r, err)
				return
			}
			w.cmds[r] = cmd
			go func(r int, cmd *exec.Cmd) { w.exits <- workerExit{r, cmd.Wait()} }(r, cmd)
		}
		started <- nil
		<-w.release
	}()
	return <-started
}

// signalAll sends s to every worker still running.
func (w *workers) signalAll(s os.Signal) {
	for _, c := range w.cmds {
		if c.ProcessState == nil {
			_ = c.Process.Signal(s)
		}
	}
}

// supervise waits for every worker to exit, forwarding SIGINT and SIGTERM, stopping the others at the
// first failure (SIGTERM, SIGKILL after grace) and killing at once a rank its peers report lost. It
// returns the first failure, or nil when every worker exited 0.
func (w *workers) supervise(ctx context.Context, grace time.Duration) *ExitError {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var first *ExitError
	var killTimer <-chan time.Time
	killedFor := map[int]PeerLostError{} // the ranks killed because a peer reported them lost
	for left := len(w.cmds); left > 0; {
		select {
		case s := <-sigs:
			log.Warn().Str("signal", s.String()).Msg("forwarding to every worker")
			w.signalAll(s)
		case <-ctx.Done():
			w.signalAll(syscall.SIGTERM)
			ctx = context.Background()
		case <-killTimer:
			log.Warn().Dur("grace", grace).Msg("workers still running after a failure: killing them")
			w.signalAll(syscall.SIGKILL)
		case rep := <-w.reports.lost:
			w.killLost(rep, killedFor)
		case x := <-w.exits:
			left--
			if x.err == nil || first != nil {
				continue
			}
			first = failure(x, killedFor)
			w.signalAll(syscall.SIGTERM)
			killTimer = time.After(grace)
		}
	}
	return first
}

// killLost kills a rank its peers report lost, once: a rank found hung will not stop on SIGTERM (a
// stopped one cannot), so it is killed now rather than after the grace period.
func (w *workers) killLost(rep PeerLostError, killedFor map[int]PeerLostError) {
	if _, seen := killedFor[rep.Rank]; !seen && rep.Rank >= 0 && rep.Rank < len(w.cmds) && rep.Rank != rep.By {
		killedFor[rep.Rank] = rep
		log.Warn().Int("rank", rep.Rank).Int("reported_by", rep.By).Msg("a rank reports this one lost: killing it")
		_ = w.cmds[rep.Rank].Process.Signal(syscall.SIGKILL)
	}
}

// failure is the first failed exit as an ExitError: a rank killed because a peer reported it lost is
// blamed with that report; any other carries its exit status.
func failure(x workerExit, killedFor map[int]PeerLostError) *ExitError {
	if rep, ok := killedFor[x.rank]; ok {
		log.Error().Int("rank", x.rank).Int("reported_by", rep.By).Msg("worker lost: stopping the others")
		return &ExitError{Rank: x.rank, Code: -1, Err: errors.New(rep.Msg), ReportedBy: rep.By}
	}
	first := &ExitError{Rank: x.rank, Code: -1, Err: x.err, ReportedBy: -1}
	var ee *exec.ExitError
	if errors.As(x.err, &ee) {
		first.Code = ee.ExitCode()
	}
	log.Error().Int("rank", x.rank).Err(x.err).Msg("worker failed: stopping the others")
	return first
}

// blame returns the first failure, or the peer it reported lost when that rank failed because it lost
// one (a rank that noticed a hung peer exits first, but the hung one is to blame).
func (w *workers) blame(first *ExitError) error {
	// Every worker has exited, so the reports are complete (a second bounds a grandchild that kept
	// the pipe open).
	for _, rep := range w.reports.wait(time.Second) {
		if rep.By == first.Rank && rep.Rank >= 0 && rep.Rank != rep.By {
			log.Error().Int("rank", rep.Rank).Int("reported_by", rep.By).Msg("the first failure was a lost peer: blaming it")
			return &ExitError{Rank: rep.Rank, Code: first.Code, Err: errors.New(rep.Msg), ReportedBy: rep.By}
		}
	}
	return first
}

// WithoutLaunchVars drops the parent's own launch variables (a launcher inside a launcher).
func WithoutLaunchVars(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", reportFDVar:
			continue
		}
		out = append(out, kv)
	}
	return out
}
