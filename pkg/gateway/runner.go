package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/drmas/drmas/pkg/netaddr"
	"github.com/drmas/drmas/pkg/replica"
	"github.com/rs/zerolog/log"
)

// The runner contract: drmas POSTs each episode to <runner.url>/run,
//
//	{"episode_id", "task", "base_url", "api_key", "agents", "seed"}
//
// the runner plays it with its own code, calling base_url (an OpenAI-compatible endpoint of this
// episode alone, keyed with api_key) with each agent's name as the model, and answers
//
//	{"reward": number, "agent_rewards": {name: number}?, "success": bool?,
//	 "calls": [{"valid": bool?, "role_reward": number?}]?}
//
// reward is the episode's team reward, agent_rewards optional role rewards, success whether the
// episode succeeded (validation's pass@k; default reward > 0), calls optional notes on each call of
// the episode in the order the endpoint served them (one entry per call): a call the runner found
// malformed (valid false: scored with the orchestra's invalid-call penalty, as a built-in
// orchestra's) and its own role reward (instead of its agent's in agent_rewards).

// runRequest is the body of POST /run.
type runRequest struct {
	EpisodeID string          `json:"episode_id"`
	Task      json.RawMessage `json:"task"`
	BaseURL   string          `json:"base_url"`
	APIKey    string          `json:"api_key"`
	Agents    []string        `json:"agents"`
	Seed      int64           `json:"seed"`
}

// runReply is the runner's answer.
type runReply struct {
	Reward       float64
	AgentRewards map[string]float64
	Success      bool
	Calls        []callNote // nil: none given
}

// callNote is the runner's word on one call of its episode.
type callNote struct {
	Valid      *bool    `json:"valid"`
	RoleReward *float64 `json:"role_reward"`
}

// Bounds on a runner's answer: what drmas reads of it, and its figures.
const (
	maxReply  = 1 << 20 // bytes
	maxReward = 1e6     // |reward|, |agent reward|: beyond it a runner's number is a mistake
	maxCalls  = 1 << 16 // entries of calls
)

// errUnreachable marks an episode no attempt of which reached the runner.
var errUnreachable = errors.New("runner unreachable")

// errBroken marks an attempt whose connection to the runner broke (reset, closed before the answer):
// a runner that died, when drmas started it.
var errBroken = errors.New("connection to the runner broke")

// runner is the program that plays the episodes: its client and, when drmas starts it, its process.
type runner struct {
	cfg Config
	hc  *http.Client

	shared bool // the runner another local rank started and supervises

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	exited   chan struct{} // closed when the current process exits
	restarts int
}

func newRunner(cfg Config) *runner {
	return &runner{cfg: cfg, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency, MaxConnsPerHost: cfg.Concurrency + 4}}}
}

// play sends one episode and reads the runner's answer, bounded in time (runner.timeout) and size.
func (r *runner) play(ctx context.Context, req runRequest, agents map[string]*agentSpec) (runReply, error) {
	body, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(r.cfg.URL, "/")+"/run", bytes.NewReader(body))
	if err != nil {
		return runReply{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(hr)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return runReply{}, fmt.Errorf("%w: %s: %v", errUnreachable, r.cfg.URL, err)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return runReply{}, fmt.Errorf("no answer within runner.timeout %s", r.cfg.Timeout)
		}
		return runReply{}, fmt.Errorf("%w: %v", errBroken, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return runReply{}, fmt.Errorf("no answer within runner.timeout %s", r.cfg.Timeout)
		}
		return runReply{}, fmt.Errorf("%w: reading the answer: %v", errBroken, err)
	}
	if len(b) > maxReply {
		return runReply{}, fmt.Errorf("answer over %d bytes (cut there): want {\"reward\": number, \"agent_rewards\": {...}}", maxReply)
	}
	if resp.StatusCode != http.StatusOK {
		return runReply{}, fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return readReply(b, agents)
}

// readReply reads an answer strictly: reward a finite number within ±maxReward, agent_rewards the
// team's agents' finite numbers, calls' role rewards likewise, nothing else.
func readReply(b []byte, agents map[string]*agentSpec) (runReply, error) {
	var raw struct {
		Reward       *float64           `json:"reward"`
		AgentRewards map[string]float64 `json:"agent_rewards"`
		Success      *bool              `json:"success"`
		Calls        []callNote         `json:"calls"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return runReply{}, fmt.Errorf("answer %.120q is not {\"reward\": number, \"agent_rewards\": {name: number}?, \"success\": bool?, \"calls\": [{\"valid\": bool?, \"role_reward\": number?}]?}: %v", b, err)
	}
	if raw.Reward == nil {
		return runReply{}, fmt.Errorf("answer %.120q has no reward", b)
	}
	out := runReply{Reward: *raw.Reward, AgentRewards: raw.AgentRewards, Success: *raw.Reward > 0, Calls: raw.Calls}
	if math.IsNaN(out.Reward) || math.Abs(out.Reward) > maxReward {
		return runReply{}, fmt.Errorf("reward %g is beyond ±%g", out.Reward, maxReward)
	}
	for name, v := range raw.AgentRewards {
		if agents[name] == nil {
			return runReply{}, fmt.Errorf("agent_rewards names %q, not an agent of the team", name)
		}
		if math.IsNaN(v) || math.Abs(v) > maxReward {
			return runReply{}, fmt.Errorf("agent_rewards[%s] %g is beyond ±%g", name, v, maxReward)
		}
	}
	if len(raw.Calls) > maxCalls {
		return runReply{}, fmt.Errorf("calls lists %d entries: more than %d", len(raw.Calls), maxCalls)
	}
	for i, c := range raw.Calls {
		if v := c.RoleReward; v != nil && (math.IsNaN(*v) || math.Abs(*v) > maxReward) {
			return runReply{}, fmt.Errorf("calls[%d].role_reward %g is beyond ±%g", i, *v, maxReward)
		}
	}
	if raw.Success != nil {
		out.Success = *raw.Success
	}
	return out, nil
}

// start starts the runner's command (none: nothing to do) and waits until its URL accepts
// connections; a supervisor restarts it if it dies before stop. Of data-parallel ranks on one
// machine, local rank 0 starts it and the others wait for it (shared): one runner at its URL.
func (r *runner) start(ctx context.Context) error {
	if r.cfg.Command == "" {
		return nil
	}
	if rank := os.Getenv("LOCAL_RANK"); rank != "" && rank != "0" {
		r.shared = true
		return r.ready(ctx, true)
	}
	if err := r.launch(); err != nil {
		return err
	}
	return r.ready(ctx, false)
}

// launch starts the process once and its supervisor.
func (r *runner) launch() error {
	cmd := exec.Command(r.cfg.Command, r.cfg.Args...)
	cmd.Env = os.Environ()
	for k, v := range r.cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "DRMAS_RUNNER_URL="+r.cfg.URL)
	cmd.Stdout, cmd.Stderr = prefixed("runner"), prefixed("runner")
	replica.DieWithParent(cmd) // no runner outlives a killed trainer
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("runner: start %s: %w", r.cfg.Command, err)
	}
	exited := make(chan struct{})
	r.mu.Lock()
	r.cmd, r.exited = cmd, exited
	r.mu.Unlock()
	log.Info().Str("command", r.cfg.Command).Strs("args", r.cfg.Args).Int("pid", cmd.Process.Pid).Str("url", r.cfg.URL).Msg("gateway runner started")
	go r.supervise(cmd, exited)
	return nil
}

// supervise waits for the process and restarts it when it dies unasked (backoff 1 s doubling to 30 s).
func (r *runner) supervise(cmd *exec.Cmd, exited chan struct{}) {
	err := cmd.Wait()
	close(exited)
	r.mu.Lock()
	stopping := r.stopping
	r.restarts++
	n := r.restarts
	r.mu.Unlock()
	if stopping {
		return
	}
	wait := min(time.Second<<min(n-1, 5), 30*time.Second)
	log.Warn().Err(err).Str("command", r.cfg.Command).Dur("restart_in", wait).Msg("gateway runner exited: restarting it (its episodes in flight are played again)")
	time.Sleep(wait)
	r.mu.Lock()
	stopping = r.stopping
	r.mu.Unlock()
	if !stopping {
		if err := r.launch(); err != nil {
			log.Error().Err(err).Msg("gateway runner could not be restarted")
		}
	}
}

// ready waits until the runner's URL accepts connections (runner.start_timeout). At the start
// (restarting false) a process that exits first is an error at once; during the run (restarting
// true) the supervisor's restarts are waited for, until the URL answers or start_timeout passes.
func (r *runner) ready(ctx context.Context, restarting bool) error {
	u, err := url.Parse(r.cfg.URL)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(r.cfg.StartTimeout)
	for {
		if netaddr.Dial(u, time.Second) == nil {
			return nil
		}
		r.mu.Lock()
		exited, stopping := r.exited, r.stopping
		r.mu.Unlock()
		select {
		case <-exited:
			if !restarting || stopping {
				return fmt.Errorf("runner %s exited before %s answered", r.cfg.Command, r.cfg.URL)
			}
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runner %s: %s did not answer within runner.start_timeout %s", r.cfg.Command, r.cfg.URL, r.cfg.StartTimeout)
		}
	}
}

// current is the exit signal of the runner's process now (nil when drmas started none).
func (r *runner) current() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exited
}

// recover follows a failed attempt on a runner drmas started: when the process the attempt went to
// (proc, from current) died — a broken connection gives it a second to be seen exiting — it waits for
// the supervisor's restart to answer (runner.start_timeout); a process still alive needs nothing. A
// rank sharing another's runner waits for its URL to answer again.
func (r *runner) recover(ctx context.Context, proc <-chan struct{}, broken bool) error {
	if r.shared && broken { // another rank restarts it
		return r.ready(ctx, true)
	}
	if proc == nil {
		return nil
	}
	if broken {
		select {
		case <-proc:
		case <-time.After(time.Second):
		}
	}
	select {
	case <-proc:
	default:
		return nil
	}
	deadline := time.Now().Add(r.cfg.StartTimeout)
	for r.current() == proc {
		if time.Now().After(deadline) {
			return fmt.Errorf("runner %s was not restarted within runner.start_timeout %s", r.cfg.Command, r.cfg.StartTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return r.ready(ctx, true)
}

// stop ends the process drmas started: SIGTERM, then SIGKILL after 5 s.
func (r *runner) stop() {
	r.mu.Lock()
	r.stopping = true
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// prefixed is a writer of the runner's output to drmas's stderr, each line prefixed.
func prefixed(name string) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(os.Stderr, "[%s] %s\n", name, sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return pw
}
