package replica

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog/log"
)

// Launcher makes the command that runs `drmas <args>`: by default this executable; tests run their
// own binary as the CLI.
type Launcher func(args []string) *exec.Cmd

// Self runs this executable.
func Self(args []string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exec.Command(exe, args...)
}

// Options describe a model's replicas.
type Options struct {
	Model   string   // the model id (names logs and errors)
	Folder  string   // the model folder each replica starts from
	Root    string   // --weights-root: the run folder, where the trainer writes the weights it syncs
	Logs    string   // the folder of the replicas' logs and pid files
	Count   int      // replicas (≥ 1)
	Devices []string // a device per replica (cycled; empty: the launcher's default)
	Threads int      // libtorch threads per replica (0: serve's default)
	CPUs    []string // a CPU list per replica (cycled; ParseCPUs): its affinity (empty: the parent's)
	DType   string   // serve --dtype ("" = auto)
	Launch  Launcher // nil: Self
	// Current, when set, is the folder and version the engines were last synced to: a restarted
	// replica is reloaded to it before it serves again.
	Current func() (dir, version string)
}

// Set is a model's running replicas.
type Set struct {
	opt  Options
	key  string
	reps []*proc

	mu       sync.Mutex
	closing  bool
	watchers sync.WaitGroup
}

// proc is one replica process and its supervision.
type proc struct {
	i        int
	port     int
	url      string
	cmd      *exec.Cmd
	exited   chan struct{}
	restarts int
	up       chan struct{} // closed when the replica answers after its latest (re)start
}

// Start launches the replicas on loopback with a fresh API key and weight updates from opt.Root,
// waits until each answers, and supervises them: a replica that exits is restarted on its port,
// reloaded to opt.Current, and named in the log with its log file.
func Start(ctx context.Context, opt Options) (*Set, error) {
	if opt.Count < 1 {
		return nil, fmt.Errorf("model %s: %d managed replicas (want ≥ 1)", opt.Model, opt.Count)
	}
	if opt.Launch == nil {
		opt.Launch = Self
	}
	if err := os.MkdirAll(opt.Logs, 0o755); err != nil {
		return nil, err
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	s := &Set{opt: opt, key: hex.EncodeToString(b)}
	for i := 0; i < opt.Count; i++ {
		p := &proc{i: i, up: make(chan struct{})}
		s.reps = append(s.reps, p)
		if err := s.start(ctx, p, opt.Folder); err != nil {
			s.Close()
			return nil, err
		}
		close(p.up)
	}
	return s, nil
}

// URLs are the replicas' base URLs.
func (s *Set) URLs() []string {
	out := make([]string, len(s.reps))
	for i, p := range s.reps {
		out[i] = p.url
	}
	return out
}

// Key is the API key the replicas require.
func (s *Set) Key() string { return s.key }

// Restarts counts the restarts since Start.
func (s *Set) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.reps {
		n += p.restarts
	}
	return n
}

// Ready waits until every replica answers after its latest (re)start, or ctx ends.
func (s *Set) Ready(ctx context.Context) error {
	for _, p := range s.reps {
		s.mu.Lock()
		up := p.up
		s.mu.Unlock()
		select {
		case <-up:
		case <-ctx.Done():
			return fmt.Errorf("model %s: managed replica %d (%s) did not come back: %w (log %s)", s.opt.Model, p.i, p.url, ctx.Err(), s.logPath(p))
		}
	}
	return nil
}

// Close stops the replicas (SIGTERM, then SIGKILL after 10 s) and their supervision; a restart under
// way stops itself when it sees the set closing.
func (s *Set) Close() {
	s.mu.Lock()
	s.closing = true
	procs := make([]struct {
		cmd    *exec.Cmd
		exited chan struct{}
		pid    string
	}, len(s.reps))
	for i, p := range s.reps {
		procs[i].cmd, procs[i].exited, procs[i].pid = p.cmd, p.exited, s.pidPath(p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		if p.cmd == nil || p.cmd.Process == nil {
			continue
		}
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		_ = os.Remove(p.pid)
	}
	s.watchers.Wait()
}

func (s *Set) logPath(p *proc) string {
	return filepath.Join(s.opt.Logs, fmt.Sprintf("%s-%d.log", s.opt.Model, p.i))
}

func (s *Set) pidPath(p *proc) string {
	return filepath.Join(s.opt.Logs, fmt.Sprintf("%s-%d.pid", s.opt.Model, p.i))
}

// args are `drmas serve`'s arguments for replica p (port 0 the first time: any free one).
func (s *Set) args(p *proc, folder string) []string {
	a := []string{"--log-format", "json", "serve", "--model", folder, "--host", "127.0.0.1", "--port", strconv.Itoa(p.port),
		"--enable-weight-updates", "--weights-root", s.opt.Root}
	if len(s.opt.Devices) > 0 {
		a = append([]string{"--device", s.opt.Devices[p.i%len(s.opt.Devices)]}, a...)
	}
	if s.opt.Threads > 0 {
		a = append(a, "--threads", strconv.Itoa(s.opt.Threads))
	}
	if s.opt.DType != "" {
		a = append(a, "--dtype", s.opt.DType)
	}
	return a
}

// start launches replica p from folder, reads the address it prints, waits for /health and starts
// watching it.
func (s *Set) start(ctx context.Context, p *proc, folder string) error {
	cmd, out, logf, err := s.launch(p, folder)
	if err != nil {
		return err
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing { // Close ran while this restart was under way
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		return errClosing
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			addr <- strings.TrimSpace(sc.Text())
		}
		close(addr)
		_, _ = io.Copy(logf, out)
	}()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	url, err := s.healthyAt(ctx, p, addr, exited)
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return err
	}
	port, _ := strconv.Atoi(url[strings.LastIndex(url, ":")+1:])
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = cmd.Process.Kill()
		<-exited
		return errClosing
	}
	p.cmd, p.exited, p.url, p.port = cmd, exited, url, port
	s.watchers.Add(1)
	s.mu.Unlock()
	_ = os.WriteFile(s.pidPath(p), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	go s.watch(p, exited)
	return nil
}

// launch starts replica p's process from folder: the key in its environment, its threads, its CPUs,
// stderr to its log, and stdout piped (the address it prints). logf is the open log, for the rest of
// stdout; on an error nothing is left open.
func (s *Set) launch(p *proc, folder string) (cmd *exec.Cmd, out io.ReadCloser, logf *os.File, err error) {
	cmd = s.opt.Launch(s.args(p, folder))
	cmd.Env = append(cmd.Environ(), "DRMAS_API_KEY="+s.key) // not on the command line, where ps shows it
	if s.opt.Threads > 0 {                                  // the matrix products' threads too (oneDNN's OpenMP pool, OpenBLAS's)
		cmd.Env = append(cmd.Env, "OMP_NUM_THREADS="+strconv.Itoa(s.opt.Threads))
	}
	DieWithParent(cmd)
	logf, err = os.OpenFile(s.logPath(p), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, nil, err
	}
	cmd.Stderr = logf
	out, err = cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, nil, nil, err
	}
	var cpus []int
	if len(s.opt.CPUs) > 0 {
		if cpus, err = ParseCPUs(s.opt.CPUs[p.i%len(s.opt.CPUs)]); err != nil {
			logf.Close()
			return nil, nil, nil, fmt.Errorf("model %s: managed replica %d: %w", s.opt.Model, p.i, err)
		}
	}
	if err := startOn(cmd, cpus); err != nil {
		logf.Close()
		return nil, nil, nil, fmt.Errorf("model %s: start managed replica %d: %w", s.opt.Model, p.i, err)
	}
	return cmd, out, logf, nil
}

// healthyAt waits (two minutes at most) for the address replica p prints, then for it to answer
// /health, and returns its URL; an error when it printed none, or exited, or never became healthy.
func (s *Set) healthyAt(ctx context.Context, p *proc, addr <-chan string, exited chan struct{}) (string, error) {
	var url string
	select {
	case url = <-addr:
	case <-exited:
	case <-time.After(2 * time.Minute):
	}
	if url == "" {
		return "", fmt.Errorf("model %s: managed replica %d printed no address (log %s)", s.opt.Model, p.i, s.logPath(p))
	}
	if !strings.HasPrefix(url, "http") {
		url = "http://" + url
	}
	if err := waitHealthy(ctx, url, exited); err != nil {
		return "", fmt.Errorf("model %s: managed replica %d at %s: %w (log %s)", s.opt.Model, p.i, url, err, s.logPath(p))
	}
	return url, nil
}

// watch restarts replica p when it exits while the set is open, from the weights the engines serve
// (Options.Current, read once), and gives it their version before it is marked up again.
func (s *Set) watch(p *proc, exited chan struct{}) {
	defer s.watchers.Done()
	<-exited
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return
		}
		if attempt == 0 {
			p.restarts++
			p.up = make(chan struct{})
		}
		s.mu.Unlock()
		log.Warn().Str("model", s.opt.Model).Int("replica", p.i).Str("url", p.url).Str("log", s.logPath(p)).Int("attempt", attempt+1).
			Msg("managed replica exited: restarting it on its port")
		folder, version := s.opt.Folder, ""
		if s.opt.Current != nil {
			if dir, v := s.opt.Current(); dir != "" {
				folder, version = dir, v
			}
		}
		err := s.start(context.Background(), p, folder)
		if errors.Is(err, errClosing) {
			return
		}
		if err == nil {
			err = s.setVersion(p, version)
		}
		if err == nil {
			s.mu.Lock()
			close(p.up)
			s.mu.Unlock()
			return
		}
		log.Error().Err(err).Str("model", s.opt.Model).Int("replica", p.i).Msg("managed replica: restart failed; trying again")
		time.Sleep(time.Duration(min(1<<attempt, 30)) * time.Second)
	}
}

// errClosing ends a restart that Close overtook.
var errClosing = errors.New("replica set closing")

// setVersion gives a restarted replica, started from the weights the engines serve, their version.
func (s *Set) setVersion(p *proc, version string) error {
	if version == "" {
		return nil
	}
	body, _ := json.Marshal(map[string]any{"new_version": version})
	req, err := http.NewRequest(http.MethodPost, p.url+"/update_weight_version", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return fmt.Errorf("set %s's weights version to %s: %w", p.url, version, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("set %s's weights version to %s: HTTP %d: %s", p.url, version, resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

// waitHealthy polls url/health until it answers 200, the process exits or a minute passes.
func waitHealthy(ctx context.Context, url string, exited chan struct{}) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before it answered /health")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.New("no answer to /health within a minute")
}
