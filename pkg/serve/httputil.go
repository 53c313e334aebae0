package serve

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
			writeError(w, &apiError{status: http.StatusUnauthorized, code: "invalid_api_key",
				msg: "missing or wrong API key: send the server's --api-key (or DRMAS_API_KEY) as \"Authorization: Bearer <key>\""})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// limitListener accepts at most n connections at once: the next Accept waits until one closes, so
// that idle or slow clients cannot take every file descriptor of the process.
type limitListener struct {
	net.Listener
	slots  chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), closed: make(chan struct{})}
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { close(l.closed) })
	return err
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
