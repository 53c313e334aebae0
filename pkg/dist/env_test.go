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
