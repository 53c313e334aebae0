package dist

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// reportFDVar names the file descriptor on which a worker started by Launch tells the launcher which
// peer it lost (one line per verdict: "<by> <rank> <message>", shorter than PIPE_BUF so that the
// workers' lines never interleave).
const reportFDVar = "DRMAS_LAUNCH_REPORT_FD"

// reportPipe is the launcher's end of the workers' reports.
type reportPipe struct {
	r, w *os.File
	mu   sync.Mutex
	got  []PeerLostError
	done chan struct{}
	// lost has each report as it arrives (never blocking the reader: it holds every worker's at most).
	lost chan PeerLostError
}

func newReportPipe() (*reportPipe, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("launcher report pipe: %w", err)
	}
	return &reportPipe{r: r, w: w, done: make(chan struct{}), lost: make(chan PeerLostError, 256)}, nil
}

// startReading closes the launcher's copy of the write end and reads the workers' lines until the
// last worker's copy closes.
func (p *reportPipe) startReading() {
	_ = p.w.Close()
	go func() {
		defer close(p.done)
		defer p.r.Close()
		sc := bufio.NewScanner(p.r)
		for sc.Scan() {
			if rep, ok := parseReport(sc.Text()); ok {
				p.mu.Lock()
				p.got = append(p.got, rep)
				p.mu.Unlock()
				select {
				case p.lost <- rep:
				default:
				}
			}
		}
	}()
}

// wait returns the reports once every worker has closed the pipe, or after timeout.
func (p *reportPipe) wait(timeout time.Duration) []PeerLostError {
	select {
	case <-p.done:
	case <-time.After(timeout):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]PeerLostError(nil), p.got...)
}

func formatReport(e *PeerLostError) string {
	msg := strings.ReplaceAll(e.Msg, "\n", " ")
	if len(msg) > 480 {
		msg = msg[:480]
	}
	return fmt.Sprintf("%d %d %s\n", e.By, e.Rank, msg)
}

func parseReport(line string) (PeerLostError, bool) {
	f := strings.SplitN(line, " ", 3)
	if len(f) != 3 {
		return PeerLostError{}, false
	}
	by, err1 := strconv.Atoi(f[0])
	rank, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return PeerLostError{}, false
	}
	return PeerLostError{Rank: rank, By: by, Msg: f[2]}, true
}

var launcher struct {
	once sync.Once
	f    *os.File
}

// LauncherReports takes the report descriptor Launch handed this worker, once: the variable is
// removed from the environment and the descriptor closed on exec, so that no process this one starts
// inherits either. It is nil outside Launch's workers.
func LauncherReports() *os.File {
	launcher.once.Do(func() {
		v := os.Getenv(reportFDVar)
		if v == "" {
			return
		}
		_ = os.Unsetenv(reportFDVar)
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 3 {
			return
		}
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			return // not the launcher's pipe
		}
		syscall.CloseOnExec(fd)
		launcher.f = os.NewFile(uintptr(fd), "launcher-report")
	})
	return launcher.f
}

// ReportToLauncher tells the launcher, if any, whom this rank blames.
func ReportToLauncher(e *PeerLostError) {
	if f := LauncherReports(); f != nil {
		_, _ = f.WriteString(formatReport(e))
	}
}

// PeerLostError is the monitor's verdict: Rank (−1 for a launcher's agent serving the store)
// stopped responding, as seen by rank By.
type PeerLostError struct {
	Rank, By int
	Msg      string
}

func (e *PeerLostError) Error() string { return e.Msg }
