// Package c10d is drmas's process group on libtorch's own distributed engine, c10d: Init (or Join,
// from the dist: section) joins a TCPStore rendezvous and a Gloo (CPU) or NCCL (CUDA) process group
// (a Group, with the collectives training needs: AllReduce, Broadcast, AllGather, Barrier on gotch
// tensors). The C++ shim is compiled at set-up by scripts/torchsetup; this is the one package that
// uses it.
//
// A nil *Group is the single-process group: every collective is a no-op on it, so callers need no
// special case for world size 1 without a launch environment.
//
// Faults: every collective is bounded by the group's timeout, and a monitor goroutine exchanges
// heartbeats through the store; a peer whose heartbeat stops (killed, crashed, stopped) ends this
// process with an error naming that rank, also while this rank waits in a collective. The store's
// host is watched too (a watchdog times the monitor's round trips to the store), so a hung rank 0 is
// named within the same bound as any other rank. Ranks started by dist.Launch report whom they blame
// to the launcher, which names the lost rank in its own error.
//
// At rendezvous the ranks compare an identity (Options.Identity: the resolved config, the binary's
// version) and refuse to start when it differs, naming the keys.
package c10d

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drmas/drmas/pkg/dist"
	"github.com/rs/zerolog/log"
	lib "github.com/sugarme/gotch/libtch"
)

// Options tune a group.
type Options struct {
	// Backend is "gloo" (CPU tensors) or "nccl" (CUDA tensors; only when set-up found NCCL).
	Backend string
	// Timeout bounds the rendezvous and every collective (default 30 minutes, as in PyTorch).
	Timeout time.Duration
	// Heartbeat is the monitor's period (default 1 s); a peer silent for Stall (default 60 s) ends the run.
	Heartbeat, Stall time.Duration
	// OnPeerLost is called once by the monitor when a peer is lost (with a *dist.PeerLostError); the
	// default logs the error and exits the process with status 1 (a collective in flight cannot be
	// interrupted otherwise).
	OnPeerLost func(error)
	// Identity is what every rank must hold alike (key → value: the resolved config, the binary's
	// version). Init compares it across the ranks right after the rendezvous and fails on every rank
	// with a *MismatchError naming the keys that differ.
	Identity map[string]string
}

// Group is this process's membership in a process group.
type Group struct {
	env  dist.Env
	opt  Options
	pg   *lib.C10dGroup
	seq  atomic.Int64 // collectives entered
	comm atomic.Int64 // nanoseconds spent in collectives

	// storeOK is when the monitor last had an answer from the store (unix nanoseconds).
	storeOK atomic.Int64

	stop     chan struct{}
	done     chan struct{}
	lostOnce sync.Once
	closed   bool
	closing  atomic.Bool // through the closing barrier: a peer that leaves now is no loss
}

// Join forms the process group of a launch environment with the dist section's settings and the
// identity the ranks must hold alike (the resolved config, the binary's version). The backend "auto"
// is NCCL when the models run on CUDA (cuda), else Gloo. A difference of identity fails on every rank
// with an error wrapping ErrMismatch that names the keys.
func Join(e dist.Env, d dist.Config, cuda bool, identity map[string]string) (*Group, error) {
	backend := d.Backend
	if backend == dist.BackendAuto {
		backend = dist.BackendGloo
		if cuda {
			backend = dist.BackendNCCL
		}
	}
	return Init(e, Options{Backend: backend, Timeout: time.Duration(d.TimeoutS) * time.Second,
		Stall: time.Duration(d.StallS) * time.Second, Identity: identity})
}

// NCCLAvailable reports whether set-up built the NCCL backend.
func NCCLAvailable() bool { return lib.C10dNCCLBuilt() }

// Init forms the group described by e: rank 0 serves the store at MASTER_ADDR:MASTER_PORT (unless
// the launcher's agent serves it, as torchrun's does) and every rank connects to it. A rendezvous that
// cannot form within the timeout is an error naming the address.
func Init(e dist.Env, opt Options) (*Group, error) {
	if opt.Backend == "" {
		opt.Backend = dist.BackendGloo
	}
	if opt.Backend != dist.BackendGloo && opt.Backend != dist.BackendNCCL {
		return nil, fmt.Errorf("dist backend %q: want gloo or nccl", opt.Backend)
	}
	if opt.Backend == dist.BackendNCCL && !NCCLAvailable() {
		return nil, fmt.Errorf("dist backend nccl: this drmas was set up against a libtorch without CUDA/NCCL (rerun make setup with LIBTORCH pointing at a CUDA libtorch)")
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 30 * time.Minute
	}
	if opt.Heartbeat <= 0 {
		opt.Heartbeat = time.Second
	}
	if opt.Stall <= 0 {
		opt.Stall = 60 * time.Second
	}
	if opt.Backend == dist.BackendNCCL {
		// Let a failed or timed-out NCCL collective end the process instead of hanging (1.13 and 2.x names).
		for _, k := range []string{"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"} {
			if os.Getenv(k) == "" {
				_ = os.Setenv(k, "1")
			}
		}
	}
	began := time.Now()
	dist.LauncherReports() // before anything starts a process that could inherit the descriptor
	var guard <-chan loopbackResult
	stopGuard := make(chan struct{})
	if e.ServesStore() && isLoopback(e.MasterAddr) {
		// A store for the ranks of this machine admits no one else (loopback.go).
		guard = guardLoopbackStore(e.MasterPort, stopGuard)
	}
	pg, err := lib.NewC10dGroup(opt.Backend, e.MasterAddr, e.MasterPort, e.Rank, e.WorldSize, opt.Timeout, e.ServesStore(), e.KeyPrefix())
	close(stopGuard)
	if guard != nil {
		if r := <-guard; err == nil && (r.err != nil || r.sockets == 0) {
			log.Warn().Err(r.err).Int("port", e.MasterPort).Msg("could not restrict the rendezvous store to the loopback device: it accepts connections on every interface")
		}
	}
	if err != nil {
		return nil, rendezvousError(e, opt, time.Since(began), err)
	}
	g := &Group{env: e, opt: opt, pg: pg, stop: make(chan struct{}), done: make(chan struct{})}
	if err := g.agree(opt.Identity); err != nil {
		pg.Close()
		return nil, err
	}
	g.storeOK.Store(time.Now().UnixNano())
	g.beat(0)
	// Every rank's heartbeat exists before any monitor reads one: the monitors' reads then never wait
	// for a key, only for a slow store.
	if err := pg.Barrier(); err != nil {
		pg.Close()
		return nil, fmt.Errorf("rendezvous at %s (rank %d of %d): first heartbeat barrier: %w", e.Addr(), e.Rank, e.WorldSize, err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); g.monitor() }()
	go func() { defer wg.Done(); g.watch() }()
	go func() { wg.Wait(); close(g.done) }()
	log.Debug().Int("rank", e.Rank).Int("world", e.WorldSize).Str("addr", e.Addr()).Str("backend", opt.Backend).
		Bool("agent_store", e.AgentStore).Dur("took", time.Since(began)).Msg("process group formed")
	return g, nil
}

// Rank is this process's rank (0 for the single-process group).
func (g *Group) Rank() int {
	if g == nil {
		return 0
	}
	return g.env.Rank
}

// Size is the world size (1 for the single-process group).
func (g *Group) Size() int {
	if g == nil {
		return 1
	}
	return g.env.WorldSize
}

// LocalRank is the rank on this machine (selects the GPU).
func (g *Group) LocalRank() int {
	if g == nil {
		return 0
	}
	return g.env.LocalRank
}

// Backend names the process group's backend ("" for the single-process group).
func (g *Group) Backend() string {
	if g == nil {
		return ""
	}
	return g.opt.Backend
}

// CommTime is the total time spent in collectives so far.
func (g *Group) CommTime() time.Duration {
	if g == nil {
		return 0
	}
	return time.Duration(g.comm.Load())
}

// Close stops the monitor, waits for every rank (so rank 0, which serves the store, leaves last) and
// shuts the group down. It is safe to call twice and on nil.
func (g *Group) Close() error {
	if g == nil || g.closed {
		return nil
	}
	g.closed = true
	// The monitor keeps beating through the barrier: rank 0 may still be writing the last checkpoint,
	// and a rank that fell silent while it waited would be taken for hung. Once every rank is through,
	// a peer that leaves is no loss.
	err := g.pg.Barrier()
	g.closing.Store(true)
	close(g.stop)
	<-g.done
	g.pg.Close()
	if err != nil {
		return fmt.Errorf("dist: closing barrier: %w", err)
	}
	return nil
}

// Abort shuts the group down without waiting for the other ranks (after an error).
func (g *Group) Abort() {
	if g == nil || g.closed {
		return
	}
	g.closed = true
	close(g.stop)
	<-g.done
	g.pg.Close()
}

// call runs one collective, timing it and turning a failure into an error that names the lost rank.
func (g *Group) call(what string, f func() error) error {
	n := g.seq.Add(1)
	began := time.Now()
	err := f()
	g.comm.Add(int64(time.Since(began)))
	if err != nil {
		return fmt.Errorf("dist: %s (collective #%d, rank %d of %d): %s: %w", what, n, g.env.Rank, g.env.WorldSize, g.diagnose(), err)
	}
	return nil
}

func hbKey(rank int) string { return "drmas/hb/" + strconv.Itoa(rank) }

// beat publishes this rank's heartbeat and collective count.
func (g *Group) beat(n int64) error {
	return g.pg.StoreSet(hbKey(g.env.Rank), []byte(fmt.Sprintf("%d %d %d", n, g.seq.Load(), os.Getpid())))
}

// peer is what a rank last published.
type peer struct {
	beat, seq int64
	at        time.Time
}

func (g *Group) readPeer(r int, timeout time.Duration) (peer, error) {
	b, err := g.pg.StoreGet(hbKey(r), timeout)
	if err != nil {
		return peer{}, err
	}
	var p peer
	if _, err := fmt.Sscan(string(b), &p.beat, &p.seq); err != nil {
		return peer{}, fmt.Errorf("heartbeat of rank %d: %q", r, b)
	}
	return p, nil
}

// monitor beats and watches the other ranks until Close. After each beat it reads its own heartbeat
// back: the round trip tells watch that the store's host still answers (a heartbeat is written
// without a reply, so a stopped host would otherwise go unnoticed).
func (g *Group) monitor() {
	tick := time.NewTicker(g.opt.Heartbeat)
	defer tick.Stop()
	last := map[int]peer{}
	for n := int64(1); ; n++ {
		select {
		case <-g.stop:
			return
		case <-tick.C:
		}
		if err := g.beat(n); err != nil {
			g.lost(&dist.PeerLostError{Rank: g.storeRank(), By: g.env.Rank, Msg: fmt.Sprintf("%s is unreachable: %v", g.env.StoreHost(), err)})
			return
		}
		// Patient (watch, not this call, bounds the wait): a read that timed out would leave its late
		// reply on the connection for the next one to misread.
		if _, err := g.readPeer(g.env.Rank, g.opt.Stall); err == nil {
			g.storeOK.Store(time.Now().UnixNano())
		}
		now := time.Now()
		for r := 0; r < g.env.WorldSize; r++ {
			if r == g.env.Rank {
				continue
			}
			// Patient too, for the same reason: every key exists (see New), so only a slow store
			// makes this wait, and watch bounds that.
			p, err := g.readPeer(r, g.opt.Stall)
			if err != nil {
				continue // a store that is gone fails the beat above
			}
			old, seen := last[r]
			if !seen || p.beat != old.beat {
				p.at = now
				last[r] = p
				continue
			}
			if now.Sub(old.at) > g.opt.Stall {
				g.lost(&dist.PeerLostError{Rank: r, By: g.env.Rank, Msg: fmt.Sprintf("rank %d stopped responding: no heartbeat for %s (dead or hung; at collective #%d, this rank at #%d)",
					r, now.Sub(old.at).Round(time.Second), old.seq, g.seq.Load())})
				return
			}
		}
	}
}

// watch ends the run when the store's host has not answered the monitor for longer than the stall
// bound: a stopped or hung host (rank 0 unless a launcher's agent serves the store) holds every
// store call, the monitor's included, so the monitor cannot see it itself.
func (g *Group) watch() {
	tick := time.NewTicker(g.opt.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-tick.C:
		}
		silent := time.Since(time.Unix(0, g.storeOK.Load()))
		if silent <= g.opt.Stall {
			continue
		}
		select {
		case <-g.stop: // closing: the monitor has stopped reading
			return
		default:
		}
		g.lost(&dist.PeerLostError{Rank: g.storeRank(), By: g.env.Rank, Msg: fmt.Sprintf(
			"%s stopped responding: the store has not answered for %s (dead or hung; this rank at collective #%d)",
			g.env.StoreHost(), silent.Round(time.Second), g.seq.Load())})
		return
	}
}

// storeRank is the rank that serves the store, −1 for a launcher's agent.
func (g *Group) storeRank() int {
	if g.env.AgentStore {
		return -1
	}
	return 0
}

func (g *Group) lost(err error) {
	if g.closing.Load() {
		return // past the closing barrier: every rank is leaving
	}
	g.lostOnce.Do(func() {
		var pe *dist.PeerLostError
		if errors.As(err, &pe) {
			dist.ReportToLauncher(pe)
		}
		if g.opt.OnPeerLost != nil {
			g.opt.OnPeerLost(err)
			return
		}
		log.Error().Int("rank", g.env.Rank).Err(err).Msg("data-parallel training lost a peer: exiting")
		os.Exit(1)
	})
}

// diagnose says which rank is to blame after a failed collective: one whose heartbeat has stopped,
// else the one furthest behind in collectives, else the store's host when it is gone.
func (g *Group) diagnose() string {
	first := map[int]peer{}
	for r := 0; r < g.env.WorldSize; r++ {
		if r == g.env.Rank {
			continue
		}
		p, err := g.readPeer(r, g.opt.Heartbeat)
		if err != nil {
			return g.env.StoreHost() + " is unreachable"
		}
		first[r] = p
	}
	time.Sleep(2*g.opt.Heartbeat + 100*time.Millisecond)
	var dead, behind []string
	mine := g.seq.Load()
	for r, p0 := range first {
		p, err := g.readPeer(r, g.opt.Heartbeat)
		if err != nil {
			return g.env.StoreHost() + " is unreachable"
		}
		if p.beat == p0.beat {
			dead = append(dead, strconv.Itoa(r))
		} else if p.seq < mine {
			behind = append(behind, fmt.Sprintf("%d (at collective #%d)", r, p.seq))
		}
	}
	switch {
	case len(dead) > 0:
		return "rank " + strings.Join(dead, ", ") + " stopped responding (dead or hung)"
	case len(behind) > 0:
		return "rank " + strings.Join(behind, ", ") + " is behind (hung or much slower)"
	}
	return "every rank is alive"
}

// rendezvousError says what failed at rendezvous (which rank, which address and port, after how
// long of which timeout) and what to check, for the rank that serves the store and for one that
// joins it.
func rendezvousError(e dist.Env, opt Options, took time.Duration, err error) error {
	head := fmt.Sprintf("rendezvous at %s (MASTER_ADDR %s, MASTER_PORT %d; rank %d of %d, backend %s) failed after %s of the %s timeout: %v",
		e.Addr(), e.MasterAddr, e.MasterPort, e.Rank, e.WorldSize, opt.Backend, took.Round(time.Millisecond), opt.Timeout, err)
	timeout := "the timeout (dist.timeout_s) covers the slowest rank's start-up (loading its model included)"
	if e.ServesStore() {
		return fmt.Errorf("%s.\nThis rank serves the rendezvous store and the other %d rank(s) did not all join it. Check that every rank was started with WORLD_SIZE=%d and the same MASTER_ADDR and MASTER_PORT; that port %d was free here (no other job or leftover drmas process holds it) and is reachable from the other hosts (firewall, the interface %s is on); and that %s",
			head, e.WorldSize-1, e.WorldSize, e.MasterPort, e.MasterAddr, timeout)
	}
	return fmt.Errorf("%s.\nThis rank could not join the store %s serves. Check that it is running (started, not crashed: see its log); that MASTER_ADDR and MASTER_PORT are the same on every rank and %s is reachable from this host (firewall, routing, the right interface); that WORLD_SIZE=%d everywhere; and that %s",
		head, e.StoreHost(), e.Addr(), e.WorldSize, timeout)
}
