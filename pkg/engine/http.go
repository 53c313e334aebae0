package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Bounds on what is read of one reply, so that a misbehaving replica cannot make the trainer
// allocate for it: an answer that is not a completion (health, model info, a reload) is small, and a
// completion grows with its tokens. Replies are read through an io.LimitReader, so a replica holds at
// most max_inflight × its largest request's bound in the trainer's memory.
const (
	maxInfoReply = 4 << 20
	// A completion gets replyBase plus replyPerToken for every prompt and sampled token it may carry:
	// the largest per-token encodings (OpenAI text pieces with their top log-prob, "bytes:\xNN"
	// escapes, vLLM's "token_id:N" strings, echoed prompt ids) stay well under 1 KiB.
	replyBase     = 1 << 20
	replyPerToken = 1 << 10
)

// completionBound is the most a completion reply may hold for a prompt of promptLen tokens and
// maxNew sampled tokens.
func completionBound(promptLen, maxNew int) int64 {
	return replyBase + replyPerToken*int64(promptLen+maxNew)
}

type replyLimitKey struct{}

// withReplyLimit sets the bound call applies to the reply of the requests made with ctx.
func withReplyLimit(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, replyLimitKey{}, n)
}

func replyLimit(ctx context.Context) int64 {
	if n, ok := ctx.Value(replyLimitKey{}).(int64); ok && n > 0 {
		return n
	}
	return maxInfoReply
}

// badRequestError is a 4xx answer: the request is wrong, so no other replica will take it either.
type badRequestError struct {
	url    string
	status int
	body   string
}

func (e *badRequestError) Error() string {
	return fmt.Sprintf("%s rejected the request (HTTP %d): %s", e.url, e.status, e.body)
}

// statusError is any other non-2xx answer (5xx: the replica is in trouble; retried elsewhere).
type statusError struct {
	url    string
	status int
	body   string
}

func (e *statusError) Error() string { return fmt.Sprintf("%s: HTTP %d: %s", e.url, e.status, e.body) }

// call sends method to url with body (JSON-encoded unless nil) and decodes a JSON reply into out
// (unless nil). Non-2xx answers and undecodable replies are errors naming the URL.
func call(ctx context.Context, hc *http.Client, method, url string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request to %s: %w", url, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	limit := replyLimit(ctx)
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return &ReplyError{URL: url, Detail: fmt.Sprintf("reply cut off after %d bytes: %v", len(data), err)}
	}
	if int64(len(data)) > limit {
		return &ReplyError{URL: url, Detail: fmt.Sprintf("reply larger than its bound of %d bytes (read no further; %d + %d per prompt and sampled token for a completion)",
			limit, replyBase, replyPerToken)}
	}
	if resp.StatusCode/100 != 2 {
		snippet := strings.TrimSpace(string(data))
		if len(snippet) > 300 {
			snippet = snippet[:300] + "…"
		}
		if resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusRequestTimeout {
			return &badRequestError{url: url, status: resp.StatusCode, body: snippet}
		}
		return &statusError{url: url, status: resp.StatusCode, body: snippet}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		snippet := string(data)
		if len(snippet) > 120 {
			snippet = snippet[:120] + "…"
		}
		return &ReplyError{URL: url, Detail: fmt.Sprintf("not the expected JSON (%v): %q", err, snippet)}
	}
	return nil
}

// bearer sends key as "Authorization: Bearer <key>" with every request of next ("" = as is).
func bearer(key string, next http.RoundTripper) http.RoundTripper {
	if key == "" {
		return next
	}
	return keyTransport{key: "Bearer " + key, next: next}
}

type keyTransport struct {
	key  string
	next http.RoundTripper
}

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", t.key)
	return t.next.RoundTrip(r)
}
