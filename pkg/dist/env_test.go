package dist

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreePort draws the rendezvous port below the kernel's ephemeral range, where no outgoing
// connection can take it between the check and the store's bind, and it is free on every interface.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no ip_local_port_range here")
	}
	lo, _ := strconv.Atoi(strings.Fields(string(b))[0])
	if lo <= 11000 {
		t.Skipf("ephemeral range starts at %d", lo)
	}
	for i := 0; i < 20; i++ {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < 10000 || port >= lo {
			t.Fatalf("port %d: want one in [10000, %d)", port, lo)
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d is not free on every interface: %v", port, err)
		}
		l.Close()
	}
}

func TestParseEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	e, ok, err := parseEnv(env())
	if err != nil || ok || e.WorldSize != 1 {
		t.Fatalf("no launch environment: %+v %v %v", e, ok, err)
	}
	e, ok, err = parseEnv(env("RANK", "1", "WORLD_SIZE", "4", "MASTER_ADDR", "node0", "MASTER_PORT", "29400"))
	if err != nil || !ok || e.Rank != 1 || e.LocalRank != 1 || e.WorldSize != 4 || e.Addr() != "node0:29400" {
		t.Fatalf("torchrun environment: %+v %v %v", e, ok, err)
	}
	e, _, err = parseEnv(env("RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "node0", "MASTER_PORT", "29400",
		"TORCHELASTIC_USE_AGENT_STORE", "True", "TORCHELASTIC_RESTART_COUNT", "2"))
	if err != nil || !e.AgentStore || e.Attempt != 2 || e.ServesStore() || e.KeyPrefix() != "drmas/attempt_2" {
		t.Fatalf("torchrun's agent store: %+v %v", e, err)
	}
	e, _, err = parseEnv(env("RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "node0", "MASTER_PORT", "29400", "TORCHELASTIC_USE_AGENT_STORE", "False"))
	if err != nil || e.AgentStore || !e.ServesStore() || e.KeyPrefix() != "" {
		t.Fatalf("a store of its own: %+v %v", e, err)
	}
	for _, c := range []struct {
		kv   []string
		want string
	}{
		{[]string{"WORLD_SIZE", "2", "RANK", "0", "MASTER_ADDR", "a", "MASTER_PORT", "1", "TORCHELASTIC_USE_AGENT_STORE", "yes"}, "TORCHELASTIC_USE_AGENT_STORE"},
		{[]string{"WORLD_SIZE", "2", "RANK", "0", "MASTER_ADDR", "a", "MASTER_PORT", "1", "TORCHELASTIC_USE_AGENT_STORE", "True", "TORCHELASTIC_RESTART_COUNT", "-1"}, "TORCHELASTIC_RESTART_COUNT"},
		{[]string{"WORLD_SIZE", "2", "MASTER_ADDR", "a", "MASTER_PORT", "1"}, "RANK is not set"},
		{[]string{"WORLD_SIZE", "2", "RANK", "2", "MASTER_ADDR", "a", "MASTER_PORT", "1"}, "RANK=2"},
		{[]string{"WORLD_SIZE", "2", "RANK", "0", "MASTER_PORT", "1"}, "MASTER_ADDR is not set"},
		{[]string{"WORLD_SIZE", "2", "RANK", "0", "MASTER_ADDR", "a"}, "MASTER_PORT is not set"},
		{[]string{"WORLD_SIZE", "x"}, `WORLD_SIZE="x"`},
		{[]string{"WORLD_SIZE", "2", "RANK", "0", "MASTER_ADDR", "a", "MASTER_PORT", "70000"}, "MASTER_PORT=70000"},
	} {
		if _, _, err := parseEnv(env(c.kv...)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want it to mention %q", c.kv, err, c.want)
		}
	}
}
