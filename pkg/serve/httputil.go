package serve

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxBody bounds a request body.
const maxBody = 16 << 20

// writeTimeout bounds each write of a reply (each event of a stream): a client that stops reading
// for that long is dropped.
const writeTimeout = 60 * time.Second

// apiError is an answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}
// (SGLang and vLLM clients read it too).
type apiError struct {
	status int
	msg    string
	param  string // the request field at fault, "" for none
	code   string // OpenAI's code ("invalid_api_key", "model_not_found"), "" for none
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...), param: param}
}

// errorType is OpenAI's "type" for a status.
func errorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return "server_busy_error"
	}
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

func (e *apiError) body() map[string]any {
	var param, code any
	if e.param != "" {
		param = e.param
	}
	if e.code != "" {
		code = e.code
	}
	return map[string]any{"error": map[string]any{"message": e.msg, "type": errorType(e.status), "param": param, "code": code}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers err in OpenAI's error shape: an *apiError with its status, anything else 500.
func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	if ae.status == http.StatusServiceUnavailable || ae.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	if ae.status == http.StatusServiceUnavailable || ae.status == http.StatusTooManyRequests || ae.status == http.StatusRequestEntityTooLarge {
		closeAfter(w) // refused before its work began: the connection's slot goes back
	}
	writeJSON(w, ae.status, ae.body())
}

// budget bounds the bytes of request bodies held at once (Options.MaxInflightBytes).
type budget struct {
	mu         sync.Mutex
	used, most int64
}

func (b *budget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.most {
		return false
	}
	b.used += n
	return true
}

func (b *budget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// readJSON reads a bounded request body into into. Twice the body's bytes (the body, and the parsed
// request that holds about as much) count against the server's in-flight budget until release is
// called (the handler defers it); when the budget is spent the request is refused with 503 before
// more of it is read.
// Once the body is read the connection's read deadline is lifted, so that a long generation is not
// cut by the read timeout meant for slow uploads.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, into any) (release func(), ok bool) {
	var held int64
	release = func() { s.inflight.give(held); held = 0 }
	if r.ContentLength > maxBody {
		writeError(w, &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("body of %d bytes: over %d", r.ContentLength, maxBody)})
		return func() {}, false
	}
	var body []byte
	rd := io.LimitReader(r.Body, maxBody+1)
	for {
		// Read in steps of 64 KiB at most, no more than the announced length (+1 to see its end).
		chunk := 64 << 10
		if r.ContentLength >= 0 {
			chunk = min(chunk, int(r.ContentLength)-len(body)+1)
		}
		if !s.inflight.take(2 * int64(chunk)) {
			release()
			// Read the rest into nothing (no memory; bounded by the read timeout) so that the client,
			// still sending, gets the answer rather than a reset connection.
			_, _ = io.Copy(io.Discard, rd)
			writeError(w, &apiError{status: http.StatusServiceUnavailable,
				msg: fmt.Sprintf("server busy: the requests in flight hold its %d MiB for request bodies; retry shortly", s.inflight.most>>20)})
			return func() {}, false
		}
		held += 2 * int64(chunk)
		body = append(body, make([]byte, chunk)...)
		n, err := io.ReadFull(rd, body[len(body)-chunk:])
		body = body[:len(body)-chunk+n]
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			release()
			writeError(w, badRequest("", "read body: %v", err))
			return func() {}, false
		}
		if len(body) > maxBody {
			release()
			writeError(w, &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("body over %d bytes", maxBody)})
			return func() {}, false
		}
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	if len(strings.TrimSpace(string(body))) == 0 {
		body = []byte("{}")
	}
	if err := json.Unmarshal(body, into); err != nil {
		release()
		writeError(w, badRequest("", "JSON body: %v", err))
		return func() {}, false
	}
	return release, true
}

// requireKey answers 401 to every request but GET /health that does not carry "Authorization:
// Bearer <key>" (as vLLM's --api-key).
func requireKey(key string, next http.Handler) http.Handler {
	want := []byte("Bearer " + key)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="drmas serve"`)
			closeAfter(w)
			writeError(w, &apiError{status: http.StatusUnauthorized, code: "invalid_api_key",
				msg: "missing or wrong API key: send the server's --api-key (or DRMAS_API_KEY) as \"Authorization: Bearer <key>\""})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// closeAfter asks net/http to close the connection once this answer is written: a client refused
// early (no key, updates off, body too large, server busy) does not keep its connection's slot.
func closeAfter(w http.ResponseWriter) { w.Header().Set("Connection", "close") }

// overflowConns are the connections accepted beyond --max-conns: on them only /health is served
// (anything else gets 503 and the connection closes), so that a server whose every slot is held
// still says it is alive, and a client is told to retry rather than left waiting to be accepted.
const overflowConns = 16

// limitListener accepts at most n connections at once, and at most perClient from one client
// address (more from it are closed as soon as they are accepted, taking no slot). Beyond n, up to
// overflowConns more are accepted as overflow connections (Server.overflowGuard); beyond those the
// next Accept waits until one closes, so that idle or slow clients cannot take every file
// descriptor of the process.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	overflow  chan struct{}
	closed    chan struct{}
	once      sync.Once
	perClient int

	mu       sync.Mutex
	byClient map[string]int
}

func newLimitListener(ln net.Listener, n, perClient int) *limitListener {
	if perClient <= 0 {
		perClient = math.MaxInt // no bound per client
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), overflow: make(chan struct{}, overflowConns),
		closed: make(chan struct{}), perClient: perClient, byClient: map[string]int{}}
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { close(l.closed) })
	return err
}

// clientOf is a connection's client address without its port.
func clientOf(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		// A free slot, else an overflow one, else wait for whichever frees first.
		var slot chan struct{}
		select {
		case l.slots <- struct{}{}:
			slot = l.slots
		default:
			select {
			case l.overflow <- struct{}{}:
				slot = l.overflow
			default:
				select {
				case l.slots <- struct{}{}:
					slot = l.slots
				case l.overflow <- struct{}{}:
					slot = l.overflow
				case <-l.closed:
					return nil, net.ErrClosed
				}
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-slot
			return nil, err
		}
		client := clientOf(c)
		l.mu.Lock()
		if l.byClient[client] >= l.perClient {
			l.mu.Unlock()
			<-slot
			l.refuse(c) // this client holds its share of the connections already
			continue
		}
		l.byClient[client]++
		l.mu.Unlock()
		return &limitConn{Conn: c, overflow: slot == l.overflow, release: func() {
			l.mu.Lock()
			if l.byClient[client]--; l.byClient[client] == 0 {
				delete(l.byClient, client)
			}
			l.mu.Unlock()
			<-slot
		}}, nil
	}
}

// tooManyFromClient is the whole answer to a connection beyond its client's share.
const tooManyFromClient = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"

// refusing bounds the refused connections being drained at once (each for at most a second).
var refusing = make(chan struct{}, 64)

// refuse answers a connection beyond its client's share with 503 and closes it. What the client
// sent is drained for up to a second first (closing a socket with unread data resets it, and the
// client would see a reset instead of the answer), unless many refusals are draining already.
func (l *limitListener) refuse(c net.Conn) {
	body := `{"error":{"message":"too many connections from this address (--max-conns-per-client); retry shortly","type":"server_busy_error","param":null,"code":null}}` + "\n"
	_ = c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, tooManyFromClient, len(body), body)
	select {
	case refusing <- struct{}{}:
		go func() {
			defer func() { <-refusing }()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20))
			c.Close()
		}()
	default:
		c.Close()
	}
}

type limitConn struct {
	net.Conn
	overflow bool // accepted beyond the bound: /health only
	once     sync.Once
	release  func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// overflowKey marks the request context of a connection accepted beyond the bound.
type overflowKey struct{}

// connContext is http.Server.ConnContext: it marks overflow connections.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitConn); ok && lc.overflow {
		return context.WithValue(ctx, overflowKey{}, true)
	}
	return ctx
}

// overflowGuard answers /health on an overflow connection and 503 to anything else, closing the
// connection after either.
func overflowGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(overflowKey{}) == nil {
			next.ServeHTTP(w, r)
			return
		}
		closeAfter(w)
		if r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		writeError(w, &apiError{status: http.StatusServiceUnavailable,
			msg: "server busy: every connection slot (--max-conns) is taken; retry shortly"})
	})
}
