package netaddr

import (
	"net"
	"net/url"
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
