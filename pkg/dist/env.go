package dist

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Env is the launch environment torchrun, SLURM scripts and Kubernetes PyTorchJob set for every
// worker: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
type Env struct {
	Rank, WorldSize, LocalRank int
	MasterAddr                 string
	MasterPort                 int
	// AgentStore is set when the launcher's agent already serves the store at MASTER_ADDR:MASTER_PORT
	// (torchrun sets TORCHELASTIC_USE_AGENT_STORE=True): every rank then connects as a client, as
	// PyTorch's own workers do, and the group's keys go under a prefix of their own per Attempt
	// (TORCHELASTIC_RESTART_COUNT), so a restarted worker group never reads a failed one's keys.
	AgentStore bool
	Attempt    int
}

// Addr is MASTER_ADDR:MASTER_PORT, where the rendezvous store is served.
func (e Env) Addr() string { return net.JoinHostPort(e.MasterAddr, strconv.Itoa(e.MasterPort)) }

// StoreHost names who serves the rendezvous store, for error messages.
func (e Env) StoreHost() string {
	if e.AgentStore {
		return "the launcher's agent (it serves the rendezvous store at " + e.Addr() + ")"
	}
	return "rank 0 (it serves the rendezvous store at " + e.Addr() + ")"
}

// ServesStore reports whether this process serves the rendezvous store.
func (e Env) ServesStore() bool { return !e.AgentStore && e.Rank == 0 }

// KeyPrefix is the prefix of the group's store keys ("" in a store of its own).
func (e Env) KeyPrefix() string {
	if !e.AgentStore {
		return ""
	}
	return "drmas/attempt_" + strconv.Itoa(e.Attempt)
}

// EnvFromOS reads the launch environment. ok is false when WORLD_SIZE is unset: a single process.
// A set but incomplete or inconsistent environment is an error naming the variable. In a worker of
// Launch it also takes the launcher's report descriptor (report.go) out of reach of child processes.
func EnvFromOS() (e Env, ok bool, err error) {
	LauncherReports()
	return parseEnv(os.Getenv)
}

func parseEnv(get func(string) string) (e Env, ok bool, err error) {
	if strings.TrimSpace(get("WORLD_SIZE")) == "" {
		return Env{WorldSize: 1}, false, nil
	}
	num := func(name string, def int, must bool) (int, error) {
		s := strings.TrimSpace(get(name))
		if s == "" {
			if must {
				return 0, fmt.Errorf("%s is not set (WORLD_SIZE is: a distributed launch needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)", name)
			}
			return def, nil
		}
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("%s=%q: want a non-negative integer", name, s)
		}
		return v, nil
	}
	if e.WorldSize, err = num("WORLD_SIZE", 1, true); err != nil {
		return e, false, err
	}
	if e.WorldSize < 1 {
		return e, false, fmt.Errorf("WORLD_SIZE=%d: want at least 1", e.WorldSize)
	}
	if e.Rank, err = num("RANK", 0, e.WorldSize > 1); err != nil {
		return e, false, err
	}
	if e.Rank >= e.WorldSize {
		return e, false, fmt.Errorf("RANK=%d: want 0 ≤ RANK < WORLD_SIZE=%d", e.Rank, e.WorldSize)
	}
	if e.LocalRank, err = num("LOCAL_RANK", e.Rank, false); err != nil {
		return e, false, err
	}
	e.MasterAddr = strings.TrimSpace(get("MASTER_ADDR"))
	if e.MasterAddr == "" {
		if e.WorldSize > 1 {
			return e, false, fmt.Errorf("MASTER_ADDR is not set (WORLD_SIZE=%d): the address of rank 0's machine", e.WorldSize)
		}
		e.MasterAddr = "127.0.0.1"
	}
	if e.MasterPort, err = num("MASTER_PORT", 29500, e.WorldSize > 1); err != nil {
		return e, false, err
	}
	if e.MasterPort < 1 || e.MasterPort > 65535 {
		return e, false, fmt.Errorf("MASTER_PORT=%d: want a TCP port (1-65535)", e.MasterPort)
	}
	// torchrun writes Python's str(bool).
	switch v := strings.TrimSpace(get("TORCHELASTIC_USE_AGENT_STORE")); v {
	case "", "False", "false", "0":
	case "True", "true", "1":
		e.AgentStore = true
		if e.Attempt, err = num("TORCHELASTIC_RESTART_COUNT", 0, false); err != nil {
			return e, false, err
		}
	default:
		return e, false, fmt.Errorf("TORCHELASTIC_USE_AGENT_STORE=%q: want True or False", v)
	}
	return e, true, nil
}

// Vars returns the environment entries of one worker, in the form os/exec takes.
func (e Env) Vars() []string {
	vars := []string{
		"RANK=" + strconv.Itoa(e.Rank),
		"WORLD_SIZE=" + strconv.Itoa(e.WorldSize),
		"LOCAL_RANK=" + strconv.Itoa(e.LocalRank),
		"MASTER_ADDR=" + e.MasterAddr,
		"MASTER_PORT=" + strconv.Itoa(e.MasterPort),
	}
	if e.AgentStore {
		vars = append(vars, "TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT="+strconv.Itoa(e.Attempt))
	}
	return vars
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
//
// The port is drawn below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where no
// outgoing connection takes one: a port the kernel hands out for ":0" is free now but may be taken
// by any connection before the store binds it (seen in the tests, with engines and replicas
// connecting beside a launch). It is checked free on every interface, as the store binds it.
func FreePort() (int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				lo = n
			}
		}
	}
	if lo > 11000 {
		for try := 0; try < 64; try++ {
			port := 10000 + rand.IntN(lo-10000)
			if l, err := net.Listen("tcp", ":"+strconv.Itoa(port)); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
