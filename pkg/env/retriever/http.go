package retriever

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/netaddr"
)

// maxReplyBytes bounds a reply body; a top-3 reply for a batch of a few hundred queries is far smaller.
const maxReplyBytes = 256 << 20

// HTTP is a client of the Search-R1 retrieval server (search_r1/search/retrieval_server.py):
// POST {"queries": [...], "topk": k, "return_scores": true} to the URL, reply
// {"result": [[{"document": {"id": ..., "contents": ...}, "score": s}, ...], ...]}. It is safe for
// concurrent use.
type HTTP struct {
	url      string
	client   *http.Client
	tries    int
	backoff  time.Duration
	deadline time.Duration
}

// maxBackoff caps the wait between tries, so that a server coming back is noticed soon.
const maxBackoff = 5 * time.Second

// CheckURL reports whether u can be a retrieval server's address: http or https with a host.
func CheckURL(u string) error {
	return netaddr.CheckHTTP(u, "http://127.0.0.1:8000/retrieve")
}

// NewHTTP returns a client of the retrieval server at cfg.URL, with cfg.Timeout per attempt,
// at least cfg.Retries tries, more while cfg.Deadline has not passed since the first, and exponential
// backoff from cfg.Backoff up to 5 s (zero values take the defaults; Deadline 0 = tries only).
func NewHTTP(cfg Config) (*HTTP, error) {
	if cfg.URL == "" {
		return nil, errors.New("retriever: type http needs a url")
	}
	if err := CheckURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("retriever: %w", err)
	}
	if cfg.Timeout < 0 || cfg.Retries < 0 || cfg.Backoff < 0 || cfg.Deadline < 0 {
		return nil, fmt.Errorf("retriever: negative timeout, retries, backoff or deadline in %+v", cfg)
	}
	h := &HTTP{url: cfg.URL, tries: cfg.Retries, backoff: cfg.Backoff, deadline: cfg.Deadline}
	if h.tries == 0 {
		h.tries = DefaultRetries
	}
	if h.backoff == 0 {
		h.backoff = DefaultBackoff
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	h.client = &http.Client{Timeout: timeout}
	return h, nil
}

// request is the body the server expects.
type request struct {
	Queries      []string `json:"queries"`
	TopK         int      `json:"topk"`
	ReturnScores bool     `json:"return_scores"`
}

// statusError is a non-2xx reply.
type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("HTTP %d %s: %s", e.code, http.StatusText(e.code), e.body)
}

// Retrieve sends all queries in one request and returns the top-k documents of each. Network errors
// (timeouts included) and 5xx replies are retried with exponential backoff, at least Retries tries
// and for as long as Deadline allows (an outage of the server shorter than that is ridden out);
// 4xx replies and malformed replies are not.
func (h *HTTP) Retrieve(ctx context.Context, queries []string, topk int) ([][]env.Doc, error) {
	if topk <= 0 {
		return nil, fmt.Errorf("retriever %s: topk %d, want > 0", h.url, topk)
	}
	if len(queries) == 0 {
		return [][]env.Doc{}, nil
	}
	body, err := json.Marshal(request{Queries: queries, TopK: topk, ReturnScores: true})
	if err != nil {
		return nil, fmt.Errorf("retriever %s: encode request: %w", h.url, err)
	}
	wait := h.backoff
	began := time.Now()
	for try := 1; ; try++ {
		reply, err := h.post(ctx, body)
		if err == nil {
			docs, err := parseReply(reply, len(queries), topk)
			if err != nil {
				return nil, fmt.Errorf("retriever %s: malformed reply: %w", h.url, err)
			}
			return docs, nil
		}
		var se *statusError
		retryable := ctx.Err() == nil && !(errors.As(err, &se) && se.code < 500)
		inTime := time.Since(began)+wait < h.deadline
		if !retryable || (try >= h.tries && !inTime) {
			return nil, fmt.Errorf("retriever %s: %w (%d of %d tries, over %s; retriever.deadline %s)",
				h.url, err, try, max(try, h.tries), time.Since(began).Round(time.Millisecond), h.deadline)
		}
		log.Warn().Err(err).Str("url", h.url).Int("try", try).Dur("backoff", wait).Msg("retrieval request failed; retrying")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("retriever %s: %w (after %v)", h.url, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBackoff)
	}
}

// post makes one attempt and returns the body of a 2xx reply.
func (h *HTTP) post(ctx context.Context, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &statusError{code: resp.StatusCode, body: snippet(b)}
	}
	return b, nil
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// parseReply accepts {"result": lists} or a bare list of lists, where each item is either
// {"document": doc, "score": s} or the doc itself, and a doc is an object with "contents"
// (or "content", or "title" + "text") and an optional "id", or a plain string.
func parseReply(b []byte, nQueries, topk int) ([][]env.Doc, error) {
	var top any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("not JSON: %w (reply starts %q)", err, snippet(b))
	}
	lists, ok := top.([]any)
	if obj, isObj := top.(map[string]any); isObj {
		res, has := obj["result"]
		if !has {
			if e, hasErr := obj["error"]; hasErr {
				return nil, fmt.Errorf("server error: %v", e)
			}
			return nil, fmt.Errorf(`no "result" field (reply starts %q)`, snippet(b))
		}
		lists, ok = res.([]any)
	}
	if !ok {
		return nil, fmt.Errorf("result is not a list of lists (reply starts %q)", snippet(b))
	}
	if len(lists) != nQueries {
		return nil, fmt.Errorf("%d result lists for %d queries", len(lists), nQueries)
	}
	out := make([][]env.Doc, len(lists))
	for i, l := range lists {
		items, ok := l.([]any)
		if !ok {
			return nil, fmt.Errorf("result %d is not a list", i)
		}
		docs := make([]env.Doc, 0, min(len(items), topk))
		for j, it := range items {
			if j == topk {
				break
			}
			d, err := parseItem(it)
			if err != nil {
				return nil, fmt.Errorf("result %d item %d: %w", i, j, err)
			}
			docs = append(docs, d)
		}
		out[i] = docs
	}
	return out, nil
}

func parseItem(it any) (env.Doc, error) {
	obj, ok := it.(map[string]any)
	if !ok {
		if s, isStr := it.(string); isStr {
			return env.Doc{Contents: s}, nil
		}
		return env.Doc{}, fmt.Errorf("not an object")
	}
	var d env.Doc
	if s, has := obj["score"]; has {
		n, isNum := s.(json.Number)
		if !isNum {
			return d, fmt.Errorf("score %v is not a number", s)
		}
		f, err := n.Float64()
		if err != nil {
			return d, fmt.Errorf("score %v: %w", s, err)
		}
		d.Score = f
	}
	doc := any(obj)
	if inner, has := obj["document"]; has {
		doc = inner
	}
	switch x := doc.(type) {
	case string:
		d.Contents = x
		return d, nil
	case map[string]any:
		return docFields(d, x)
	}
	return d, fmt.Errorf("document is neither an object nor a string")
}

func docFields(d env.Doc, m map[string]any) (env.Doc, error) {
	switch id := m["id"].(type) {
	case string:
		d.ID = id
	case json.Number:
		d.ID = id.String()
	}
	if c, ok := m["contents"].(string); ok {
		d.Contents = c
	} else if c, ok := m["content"].(string); ok {
		d.Contents = c
	} else if t, ok := m["text"].(string); ok {
		if title, ok := m["title"].(string); ok && title != "" {
			t = title + "\n" + t
		}
		d.Contents = t
	} else {
		return d, fmt.Errorf(`document has no "contents" text`)
	}
	return d, nil
}

// Close releases idle connections.
func (h *HTTP) Close() error {
	h.client.CloseIdleConnections()
	return nil
}
