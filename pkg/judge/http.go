package judge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog/log"
)

// Kinds of failure (Error.Kind).
const (
	KindUnreachable = "unreachable" // no HTTP reply: connection refused, DNS, reset
	KindTimeout     = "timeout"     // no reply within the per-attempt timeout
	KindStatus      = "status"      // a non-2xx reply
	KindMalformed   = "malformed"   // a 2xx reply that is not the expected JSON
	KindUnparseable = "unparseable" // a judge reply with no score or verdict in it
	KindTooLarge    = "too large"   // a reply longer than the bound of what one call holds
)

// Error is a named failure of a judge or remote request.
type Error struct {
	Who      string // "judge" or "remote reward"
	Endpoint string // the URL
	Kind     string // KindUnreachable, …
	Status   int    // the HTTP status (KindStatus)
	Snippet  string // the start of the reply body or text
	Tries    int    // attempts made
	Err      error  // the underlying error, if any
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: ", e.Who, e.Endpoint)
	switch e.Kind {
	case KindStatus:
		fmt.Fprintf(&b, "HTTP %d %s", e.Status, http.StatusText(e.Status))
	case KindUnparseable:
		b.WriteString("unparseable reply")
	default:
		b.WriteString(e.Kind)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Snippet != "" {
		fmt.Fprintf(&b, ": %q", e.Snippet)
	}
	if e.Tries > 1 {
		fmt.Fprintf(&b, " (%d tries)", e.Tries)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// The bounds of what one call holds of a reply, in bytes: reading stops past them and the call fails
// (KindTooLarge). A judge's reply is one chat completion of at most max_tokens tokens (4 MiB is a
// million tokens of text); a remote reward's is a score per trajectory of its batch, and per call.
const (
	MaxJudgeReplyBytes  = 4 << 20
	MaxRemoteReplyBytes = 16 << 20
)

// backoff is the first wait between attempts; it doubles up to maxBackoff.
var backoff, maxBackoff = 200 * time.Millisecond, 5 * time.Second

// client posts JSON with a per-attempt timeout, retries and a bound on requests in flight.
type client struct {
	who, url string
	key      string
	maxReply int64 // the most bytes of a reply held (MaxJudgeReplyBytes, MaxRemoteReplyBytes)
	timeout  time.Duration
	retries  int
	sem      chan struct{}
	http     *http.Client
}

func newClient(who, url string, ep Endpoint, maxReply int64) (*client, error) {
	c := &client{who: who, url: url, maxReply: maxReply, timeout: ep.Timeout, retries: ep.Retries,
		sem: make(chan struct{}, max(ep.MaxConcurrency, 1)), http: &http.Client{}}
	if ep.APIKeyEnv != "" {
		c.key = os.Getenv(ep.APIKeyEnv)
		if c.key == "" {
			return nil, fmt.Errorf("%s: the environment variable %s (api_key_env) is not set", who, ep.APIKeyEnv)
		}
	}
	if c.timeout <= 0 {
		c.timeout = time.Minute
	}
	return c, nil
}

// post sends body and returns the reply of the first attempt that gets a 2xx one. Unreachable
// endpoints, timeouts, 429 and 5xx replies are retried (c.retries more times, with backoff); other
// statuses are not. It holds one of the c.sem slots while it waits and tries.
func (c *client) post(ctx context.Context, body []byte) ([]byte, error) {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.sem }()
	wait := backoff
	for try := 1; ; try++ {
		reply, err := c.once(ctx, body)
		if err == nil {
			return reply, nil
		}
		err.Tries = try
		retry := err.Kind == KindUnreachable || err.Kind == KindTimeout ||
			(err.Kind == KindStatus && (err.Status == http.StatusTooManyRequests || err.Status >= 500))
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (after %v)", ctx.Err(), err)
		}
		if !retry || try > c.retries {
			return nil, err
		}
		log.Warn().Err(err).Int("try", try).Dur("backoff", wait).Msg(c.who + " request failed; retrying")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (after %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBackoff)
	}
}

// once makes one attempt.
func (c *client) once(ctx context.Context, body []byte) ([]byte, *Error) {
	fail := func(kind string, err error) *Error { return &Error{Who: c.who, Endpoint: c.url, Kind: kind, Err: err} }
	actx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, fail(KindUnreachable, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if timedOut(actx, ctx, err) {
			return nil, fail(KindTimeout, fmt.Errorf("no reply within %s", c.timeout))
		}
		return nil, fail(KindUnreachable, stripURL(err))
	}
	defer resp.Body.Close()
	// One byte past the bound tells a reply over it; the rest is never read (closing the body drops
	// the connection).
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.maxReply+1))
	if err != nil {
		if timedOut(actx, ctx, err) {
			return nil, fail(KindTimeout, fmt.Errorf("reply not read within %s", c.timeout))
		}
		return nil, fail(KindUnreachable, fmt.Errorf("read reply: %w", err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := fail(KindStatus, nil)
		e.Status, e.Snippet = resp.StatusCode, snippet(string(b))
		return nil, e
	}
	if int64(len(b)) > c.maxReply {
		return nil, fail(KindTooLarge, fmt.Errorf("the reply is longer than the %d bytes (%d MiB) a %s call holds; stopped reading", c.maxReply, c.maxReply>>20, c.who))
	}
	return b, nil
}

// timedOut says whether an attempt failed on its own timeout (not on the caller's cancellation).
func timedOut(attempt, caller context.Context, err error) bool {
	if caller.Err() != nil {
		return false
	}
	var ne net.Error
	return errors.Is(attempt.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// stripURL drops the *url.Error wrapper (its method and URL are in Error already).
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}

// snippet is the start of a reply, for error messages.
func snippet(s string) string {
	s = strings.TrimSpace(s)
	if r := []rune(s); len(r) > 200 {
		s = string(r[:200]) + "…"
	}
	return s
}
