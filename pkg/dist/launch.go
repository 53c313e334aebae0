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

// ExitError is a worker's failure; Code is its exit status (−1 when a signal ended it).
type ExitError struct {
	Rank int
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("rank %d failed: %v", e.Rank, e.Err)
}

// Launch runs N workers of one machine the way torchrun does: each gets RANK, LOCAL_RANK, WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, a free MASTER_PORT and, unless set, OMP_NUM_THREADS = cores/N. SIGINT and SIGTERM are forwarded to every worker. When
// a worker fails, the others are stopped (SIGTERM, then SIGKILL after the grace period) and the first
// failure is returned, naming its rank. Launch returns nil when every worker exits 0.
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
	base := withoutLaunchVars(os.Environ())
	if os.Getenv("OMP_NUM_THREADS") == "" {
		// As torchrun: N ranks share the cores (libtorch's default is one thread per core each).
		base = append(base, "OMP_NUM_THREADS="+strconv.Itoa(max(1, runtime.NumCPU()/o.N)))
	}
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, o.N)
	cmds := make([]*exec.Cmd, o.N)
	for r := 0; r < o.N; r++ {
		e := Env{Rank: r, WorldSize: o.N, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
		cmd := exec.Command(o.Program, o.Args...)
		cmd.Env = append(append(append([]string{}, base...), o.Env...), e.Vars()...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			for _, c := range cmds[:r] {
				_ = c.Process.Kill()
			}
			return fmt.Errorf("start rank %d: %w", r, err)
		}
		cmds[r] = cmd
		go func(r int, cmd *exec.Cmd) { exits <- exit{r, cmd.Wait()} }(r, cmd)
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
		case x := <-exits:
			left--
			if x.err == nil {
				continue
			}
			if first == nil {
				first = &ExitError{Rank: x.rank, Code: -1, Err: x.err}
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
	if first != nil {
		return first
	}
	return nil
}

// withoutLaunchVars drops the parent's own launch variables (a launcher inside a launcher).
func withoutLaunchVars(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT":
			continue
		}
		out = append(out, kv)
	}
	return out
}
