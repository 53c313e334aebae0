package serve

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// floodServer serves the toy model with an API key on a loopback port.
func floodServer(t *testing.T, opt Options) (url, addr string) {
	t.Helper()
	opt.APIKey = "k"
	s, err := New(loadToy(t), toyDir, opt)
	if err != nil {
		t.Fatal(err)
	}
	url = listen(t, s)
	return url, strings.TrimPrefix(url, "http://")
}

// dialFrom opens a connection to addr from the loopback address from (127.0.0.2, …: another client
// address than the test's own requests, which come from 127.0.0.1).
func dialFrom(from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// timedGets asks /health (no key) and /v1/models (with the key) from 127.0.0.1 and returns how long
// each took; a failure or a status other than want fails the test.
func timedGets(t *testing.T, url string, wantModels int) (health, models time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, g := range []struct {
		path string
		key  string
		want int
		took *time.Duration
	}{{"/health", "", 200, &health}, {"/v1/models", "k", wantModels, &models}} {
		req, _ := http.NewRequest(http.MethodGet, url+g.path, nil)
		if g.key != "" {
			req.Header.Set("Authorization", "Bearer "+g.key)
		}
		began := time.Now()
		resp, err := client.Do(req)
		*g.took = time.Since(began)
		if err != nil {
			t.Errorf("GET %s: %v after %v", g.path, err, *g.took)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != g.want {
			t.Errorf("GET %s: HTTP %d, want %d", g.path, resp.StatusCode, g.want)
		}
	}
	return health, models
}

// unauthenticated runs n clients from 127.0.0.2 that each send a request without the key every 20
// s, on their keep-alive connection while the server keeps it, on a new one when it has closed it;
// it returns once each has had its first answer (401), and stop ends them.
func unauthenticated(t *testing.T, addr string, n int) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var first, all sync.WaitGroup
	first.Add(n)
	for i := 0; i < n; i++ {
		all.Add(1)
		go func() {
			defer all.Done()
			var c net.Conn
			var rd *bufio.Reader
			answered := false
			defer func() {
				if c != nil {
					c.Close()
				}
				if !answered {
					first.Done()
				}
			}()
			for {
				if c == nil {
					var err error
					if c, err = dialFrom("127.0.0.2", addr); err != nil {
						t.Errorf("client %d: %v", i, err)
						return
					}
					rd = bufio.NewReader(c)
				}
				fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
				c.SetReadDeadline(time.Now().Add(20 * time.Second))
				resp, err := http.ReadResponse(rd, nil)
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != 401 && resp.StatusCode != 503 { // 503: an overflow connection
						t.Errorf("client %d without a key: HTTP %d", i, resp.StatusCode)
					}
					if resp.Close {
						c.Close()
						c = nil
					}
				} else {
					c.Close()
					c = nil
				}
				if !answered {
					answered = true
					first.Done()
				}
				select {
				case <-done:
					return
				case <-time.After(20 * time.Second):
				}
			}
		}()
	}
	waited := make(chan struct{})
	go func() { first.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Errorf("the %d unauthenticated clients did not all get an answer in 5 s: the first ones hold the slots", n)
	}
	return func() { close(done); all.Wait() }
}

// A client without the key cannot hold the connection slots: a 401 closes its connection (before,
// it stayed open, and clients re-sending every 20 s kept every slot for ever under the 60 s idle
// timeout). With more such clients than --max-conns, /health and a keyed request answer within a
// second.
func TestUnauthenticatedClientsDoNotHoldTheServer(t *testing.T) {
	url, addr := floodServer(t, Options{MaxConns: 64, MaxConnsPerClient: 1000})
	stop := unauthenticated(t, addr, 70)
	defer stop()
	health, models := timedGets(t, url, 200)
	t.Logf("70 unauthenticated clients, --max-conns 64: /health %v, keyed /v1/models %v", health, models)
	if health > time.Second || models > time.Second {
		t.Errorf("/health took %v, keyed /v1/models %v: want under a second each", health, models)
	}
}

// The same at the scale: 1,030 unauthenticated clients against the default --max-conns 1024.
func TestUnauthenticated1030Clients(t *testing.T) {
	if testing.Short() {
		t.Skip("1,030 connections")
	}
	url, addr := floodServer(t, Options{})
	began := time.Now()
	stop := unauthenticated(t, addr, 1030)
	defer stop()
	t.Logf("1,030 unauthenticated clients answered in %v", time.Since(began))
	health, models := timedGets(t, url, 200)
	t.Logf("1,030 unauthenticated clients, --max-conns 1024: /health %v, keyed /v1/models %v", health, models)
	if health > time.Second || models > time.Second {
		t.Errorf("/health took %v, keyed /v1/models %v: want under a second each", health, models)
	}
}

// One client address cannot take every slot: connections beyond --max-conns-per-client get a 503
// and are closed at once, so that with one address holding silent connections (which only the
// 10 s header timeout would close) others are still served at once. When every slot is held by
// several addresses, /health still answers on an overflow connection, and other requests get a
// 503 at once rather than waiting to be accepted.
func TestConnectionsBoundedPerClient(t *testing.T) {
	url, addr := floodServer(t, Options{MaxConns: 64, MaxConnsPerClient: 48})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	hold := func(from string, n int) (refused int) {
		for i := 0; i < n; i++ {
			c, err := dialFrom(from, addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		// A refused connection has its 503 waiting; a held one says nothing.
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range held[len(held)-n:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				if line, err := bufio.NewReader(c).ReadString('\n'); err == nil && strings.Contains(line, " 503 ") {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return refused
	}
	if refused := hold("127.0.0.2", 100); refused != 52 {
		t.Errorf("100 silent connections from one address with --max-conns-per-client 48: %d refused with 503, want 52", refused)
	}
	health, models := timedGets(t, url, 200)
	t.Logf("one address holding 48 silent connections of 64: /health %v, keyed /v1/models %v", health, models)
	if health > time.Second || models > time.Second {
		t.Errorf("/health took %v, keyed /v1/models %v: want under a second each", health, models)
	}

	// Every slot held (48 + 16 from two more addresses), and 4 of the 16 overflow ones.
	hold("127.0.0.3", 16)
	hold("127.0.0.4", 4)
	time.Sleep(100 * time.Millisecond)
	health, models = timedGets(t, url, 503)
	t.Logf("every slot held: /health %v, keyed /v1/models %v (503)", health, models)
	if health > time.Second || models > time.Second {
		t.Errorf("with every slot held: /health took %v, keyed /v1/models %v: want under a second each", health, models)
	}
}
