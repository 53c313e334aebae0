package netaddr

import (
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestHostPort(t *testing.T) {
	for raw, want := range map[string]string{
		"http://127.0.0.1:8000/retrieve": "127.0.0.1:8000",
		"http://localhost/v1":            "localhost:80",
		"https://judge.example.com/v1":   "judge.example.com:443",
		"http://[::1]/run":               "[::1]:80",
		"https://[::1]:8443":             "[::1]:8443",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := HostPort(u); got != want {
			t.Errorf("HostPort(%s) = %s, want %s", raw, got, want)
		}
	}
}

func TestDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	if err := Dial(u, time.Second); err != nil {
		t.Errorf("a listening server: %v", err)
	}
	ln.Close()
	if err := Dial(u, time.Second); err == nil {
		t.Error("a closed port: no error")
	}
}

func TestCheckHTTP(t *testing.T) {
	for u, ok := range map[string]bool{
		"http://127.0.0.1:8000/retrieve": true, "https://judge.example/v1": true,
		"10.0.0.5:8000": false, "ftp://h/mcp": false, "http://": false, "": false, "http://[::1": false,
	} {
		err := CheckHTTP(u, "http://127.0.0.1:30000")
		if (err == nil) != ok {
			t.Errorf("CheckHTTP(%q) = %v, want ok %v", u, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "e.g. http://127.0.0.1:30000") {
			t.Errorf("CheckHTTP(%q): %q shows no example", u, err)
		}
	}
}
