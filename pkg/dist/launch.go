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
	base := WithoutLaunchVars(os.Environ())
	if os.Getenv("OMP_NUM_THREADS") == "" {
		// As torchrun: N ranks share the cores (libtorch's default is one thread per core each).
		base = append(base, "OMP_NUM_THREADS="+strconv.Itoa(max(1, runtime.NumCPU()/o.N)))
	}
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, o.N)
	reports, err := newReportPipe()
	if err != nil {
		return err
	}
	base = append(base, reportFDVar+"=3") // the first of ExtraFiles
	cmds := make([]*exec.Cmd, o.N)
	started := make(chan error)
	release := make(chan struct{})
	defer close(release)
	go func() {
		// The parent-death signal fires when this thread ends: keep it until Launch returns.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for r := 0; r < o.N; r++ {
			e := Env{Rank: r, WorldSize: o.N, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
			cmd := exec.Command(o.Program, o.Args...)
			cmd.Env = append(append(append([]string{}, base...), o.Env...), e.Vars()...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
			cmd.ExtraFiles = []*os.File{reports.w}
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				for _, c := range cmds[:r] {
					_ = c.Process.Kill() // its own goroutine (below) reaps it: one Wait per process
				}
				for range cmds[:r] {
					<-exits
				}
				started <- fmt.Errorf("start rank %d: %w", r, err)
				return
			}
			cmds[r] = cmd
			go func(r int, cmd *exec.Cmd) { exits <- exit{r, cmd.Wait()} }(r, cmd)
		}
		started <- nil
		<-release
	}()
	err = <-started
	reports.startReading() // the workers hold the write end now
	if err != nil {
		reports.wait(time.Second)
		return err
	}
	log.Info().Int("nproc", o.N).Int("port", port).Msg("started local workers")
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	signalAll := func(s os.Signal) {
		for _, c := range cmds {
			if c.ProcessState == nil {
				_ = c.Process.Signal(s)
			}
		}
	}
	var first *ExitError
	var killTimer <-chan time.Time
	killedFor := map[int]PeerLostError{} // the ranks killed because a peer reported them lost
	for left := o.N; left > 0; {
		select {
		case s := <-sigs:
			log.Warn().Str("signal", s.String()).Msg("forwarding to every worker")
			signalAll(s)
		case <-ctx.Done():
			signalAll(syscall.SIGTERM)
			ctx = context.Background()
		case <-killTimer:
			log.Warn().Dur("grace", o.Grace).Msg("workers still running after a failure: killing them")
			signalAll(syscall.SIGKILL)
		case rep := <-reports.lost:
			// A rank found hung by its peers will not stop on SIGTERM (a stopped one cannot): kill it
			// now rather than after the grace period.
			if _, seen := killedFor[rep.Rank]; !seen && rep.Rank >= 0 && rep.Rank < o.N && rep.Rank != rep.By {
				killedFor[rep.Rank] = rep
				log.Warn().Int("rank", rep.Rank).Int("reported_by", rep.By).Msg("a rank reports this one lost: killing it")
				_ = cmds[rep.Rank].Process.Signal(syscall.SIGKILL)
			}
		case x := <-exits:
			left--
			if x.err == nil {
				continue
			}
			if rep, ok := killedFor[x.rank]; ok && first == nil {
				first = &ExitError{Rank: x.rank, Code: -1, Err: errors.New(rep.Msg), ReportedBy: rep.By}
				log.Error().Int("rank", x.rank).Int("reported_by", rep.By).Msg("worker lost: stopping the others")
				signalAll(syscall.SIGTERM)
				killTimer = time.After(o.Grace)
			}
			if first == nil {
				first = &ExitError{Rank: x.rank, Code: -1, Err: x.err, ReportedBy: -1}
				var ee *exec.ExitError
				if errors.As(x.err, &ee) {
					first.Code = ee.ExitCode()
				}
				log.Error().Int("rank", x.rank).Err(x.err).Msg("worker failed: stopping the others")
				signalAll(syscall.SIGTERM)
				killTimer = time.After(o.Grace)
			}
		}
	}
	if first == nil {
		return nil
	}
	if first.ReportedBy >= 0 {
		return first
	}
	// Every worker has exited, so the reports are complete (a second bounds a grandchild that kept
	// the pipe open).
	for _, rep := range reports.wait(time.Second) {
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
