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

// maxReply bounds what is read of one reply (a completion of a few thousand tokens with log-probs is
// well under a megabyte).
const maxReply = 64 << 20

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
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return &ReplyError{URL: url, Detail: fmt.Sprintf("reply cut off after %d bytes: %v", len(data), err)}
	}
	if len(data) > maxReply {
		return &ReplyError{URL: url, Detail: fmt.Sprintf("reply larger than %d bytes", maxReply)}
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
