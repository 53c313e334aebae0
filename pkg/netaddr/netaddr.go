// Package netaddr says where a server drmas reaches by its URL listens (a retrieval server, a reward
// server, a gateway runner) and whether it accepts connections there now.
package netaddr

import (
	"fmt"
	"net"
	"net/url"
	"time"
)

// CheckHTTP says whether u can be the address of an HTTP server drmas calls: http or https, with a
// host. The error quotes u and shows example, a URL of the kind the caller wants.
func CheckHTTP(u, example string) error {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL with a host (e.g. %s)", u, example)
	}
	return nil
}

// HostPort is the TCP address of u's server: u's host and port, with the scheme's port (443 for
// https, 80 otherwise) when u names none.
func HostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// Dial connects to u's server (HostPort) within timeout and closes the connection again: nil when
// the server accepts connections now, else why it does not.
func Dial(u *url.URL, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", HostPort(u), timeout)
	if err != nil {
		return err
	}
	c.Close()
	return nil
}
