package retriever

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/env"
)

// server starts a test server whose handler is h and counts the requests it gets.
func server(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s, &hits
}

func reply(body string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }
}

// fastCfg retries quickly so the tests stay fast.
func fastCfg(url string) Config {
	return Config{Type: TypeHTTP, URL: url + "/retrieve", Timeout: 2 * time.Second, Backoff: time.Millisecond}
}

func TestHTTPSearchR1Reply(t *testing.T) {
	var got request
	s, hits := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/retrieve" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad request line", http.StatusBadRequest)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		io.WriteString(w, `{"result": [
			[{"document": {"id": "12", "contents": "\"Paris\"\nCapital of France."}, "score": 0.9},
			 {"document": {"id": 13, "contents": "Lyon"}, "score": 0.5}],
			[]
		]}`)
	})
	r, err := New(fastCfg(s.URL))
	if err != nil {
		t.Fatal(err)
	}
	defer r.(io.Closer).Close()
	docs, err := r.Retrieve(context.Background(), []string{"capital of france", "nothing"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]env.Doc{
		{{ID: "12", Contents: "\"Paris\"\nCapital of France.", Score: 0.9}, {ID: "13", Contents: "Lyon", Score: 0.5}},
		{},
	}
	if !reflect.DeepEqual(docs, want) {
		t.Errorf("docs %+v, want %+v", docs, want)
	}
	if wantReq := (request{Queries: []string{"capital of france", "nothing"}, TopK: 2, ReturnScores: true}); !reflect.DeepEqual(got, wantReq) {
		t.Errorf("request %+v, want %+v", got, wantReq)
	}
	if hits.Load() != 1 {
		t.Errorf("%d requests, want 1", hits.Load())
	}
}

func TestHTTPOtherReplyShapes(t *testing.T) {
	tests := []struct {
		name, body string
		want       [][]env.Doc
	}{
		{"bare lists without scores", `[[{"id": "a", "contents": "x"}, {"id": "b", "contents": "y"}]]`,
			[][]env.Doc{{{ID: "a", Contents: "x"}, {ID: "b", Contents: "y"}}}},
		{"result without scores", `{"result": [[{"id": "a", "contents": "x"}]]}`,
			[][]env.Doc{{{ID: "a", Contents: "x"}}}},
		{"document strings", `{"result": [[{"document": "plain text", "score": 1}]]}`,
			[][]env.Doc{{{Contents: "plain text", Score: 1}}}},
		{"title and text", `{"result": [[{"document": {"title": "T", "text": "body"}, "score": 2.5}]]}`,
			[][]env.Doc{{{Contents: "T\nbody", Score: 2.5}}}},
		{"more than topk is cut", `{"result": [[{"contents": "1"}, {"contents": "2"}, {"contents": "3"}]]}`,
			[][]env.Doc{{{Contents: "1"}, {Contents: "2"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := server(t, reply(tt.body))
			h, err := NewHTTP(fastCfg(s.URL))
			if err != nil {
				t.Fatal(err)
			}
			docs, err := h.Retrieve(context.Background(), []string{"q"}, 2)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(docs, tt.want) {
				t.Errorf("docs %+v, want %+v", docs, tt.want)
			}
		})
	}
}

func TestHTTPTimeoutIsRetried(t *testing.T) {
	s, hits := server(t, func(w http.ResponseWriter, r *http.Request) {
		// Reading the body lets the server notice the client hanging up, which ends the wait.
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	cfg := fastCfg(s.URL)
	cfg.Timeout = 100 * time.Millisecond
	cfg.Retries = 2
	h, err := NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = h.Retrieve(context.Background(), []string{"q"}, 3)
	if err == nil || !strings.Contains(err.Error(), cfg.URL) || !strings.Contains(err.Error(), "Timeout") {
		t.Errorf("error %v, want a timeout naming %s", err, cfg.URL)
	}
	if hits.Load() != 2 {
		t.Errorf("%d requests, want 2 tries", hits.Load())
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %v; the client timeout did not bound it", el)
	}
}

func TestHTTPServerErrors(t *testing.T) {
	t.Run("500 is retried then fails", func(t *testing.T) {
		s, hits := server(t, func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "index not loaded", http.StatusInternalServerError)
		})
		cfg := fastCfg(s.URL)
		_, err := newHTTPMust(t, cfg).Retrieve(context.Background(), []string{"q"}, 3)
		if err == nil || !strings.Contains(err.Error(), cfg.URL) || !strings.Contains(err.Error(), "HTTP 500") ||
			!strings.Contains(err.Error(), "index not loaded") || !strings.Contains(err.Error(), "3 of 3 tries") {
			t.Errorf("error %v", err)
		}
		if hits.Load() != DefaultRetries {
			t.Errorf("%d requests, want %d", hits.Load(), DefaultRetries)
		}
	})
	t.Run("503 then success", func(t *testing.T) {
		var n atomic.Int32
		s, hits := server(t, func(w http.ResponseWriter, _ *http.Request) {
			if n.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, `{"result": [[{"document": {"id": "1", "contents": "ok"}, "score": 1}]]}`)
		})
		docs, err := newHTTPMust(t, fastCfg(s.URL)).Retrieve(context.Background(), []string{"q"}, 3)
		if err != nil || len(docs) != 1 || len(docs[0]) != 1 || docs[0][0].Contents != "ok" {
			t.Errorf("docs %+v err %v", docs, err)
		}
		if hits.Load() != 2 {
			t.Errorf("%d requests, want 2", hits.Load())
		}
	})
	t.Run("400 is not retried", func(t *testing.T) {
		s, hits := server(t, func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"detail": "queries must be a list"}`, http.StatusUnprocessableEntity)
		})
		cfg := fastCfg(s.URL)
		_, err := newHTTPMust(t, cfg).Retrieve(context.Background(), []string{"q"}, 3)
		if err == nil || !strings.Contains(err.Error(), cfg.URL) || !strings.Contains(err.Error(), "HTTP 422") ||
			!strings.Contains(err.Error(), "queries must be a list") {
			t.Errorf("error %v", err)
		}
		if hits.Load() != 1 {
			t.Errorf("%d requests, want 1", hits.Load())
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		s := httptest.NewServer(http.NotFoundHandler())
		cfg := fastCfg(s.URL)
		s.Close()
		_, err := newHTTPMust(t, cfg).Retrieve(context.Background(), []string{"q"}, 3)
		if err == nil || !strings.Contains(err.Error(), "retriever "+cfg.URL) || !strings.Contains(err.Error(), "3 of 3 tries") {
			t.Errorf("error %v", err)
		}
	})
	t.Run("cancelled context is not retried", func(t *testing.T) {
		s, hits := server(t, func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
		})
		cfg := fastCfg(s.URL)
		cfg.Backoff = time.Hour
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := newHTTPMust(t, cfg).Retrieve(ctx, []string{"q"}, 3)
		if err == nil || !strings.Contains(err.Error(), "context canceled") {
			t.Errorf("error %v", err)
		}
		if hits.Load() != 1 {
			t.Errorf("%d requests, want 1", hits.Load())
		}
	})
}

func newHTTPMust(t *testing.T, cfg Config) *HTTP {
	t.Helper()
	h, err := NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHTTPMalformedReplies(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"not json", "<html>oops</html>", "not JSON"},
		{"no result", `{"results": []}`, `no "result" field`},
		{"server error field", `{"error": "faiss crashed"}`, "server error: faiss crashed"},
		{"wrong count", `{"result": [[]]}`, "1 result lists for 2 queries"},
		{"result not a list", `{"result": {"a": 1}}`, "not a list of lists"},
		{"item list not a list", `{"result": [[], 5]}`, "result 1 is not a list"},
		{"item without contents", `{"result": [[], [{"document": {"id": "1"}, "score": 1}]]}`, `result 1 item 0: document has no "contents"`},
		{"score not a number", `{"result": [[], [{"document": {"contents": "x"}, "score": "high"}]]}`, "score high is not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, hits := server(t, reply(tt.body))
			cfg := fastCfg(s.URL)
			_, err := newHTTPMust(t, cfg).Retrieve(context.Background(), []string{"q1", "q2"}, 3)
			if err == nil || !strings.Contains(err.Error(), "retriever "+cfg.URL+": malformed reply") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want it to name the URL and contain %q", err, tt.want)
			}
			if hits.Load() != 1 {
				t.Errorf("%d requests, want 1 (malformed replies are not retried)", hits.Load())
			}
		})
	}
}

func TestHTTPNoQueries(t *testing.T) {
	s, hits := server(t, reply(`{"result": []}`))
	docs, err := newHTTPMust(t, fastCfg(s.URL)).Retrieve(context.Background(), nil, 3)
	if err != nil || len(docs) != 0 || hits.Load() != 0 {
		t.Errorf("docs %v err %v hits %d; want an empty result without a request", docs, err, hits.Load())
	}
}

// An outage shorter than retriever.deadline is ridden out even when the tries run out; without a
// deadline the same outage fails the request.
func TestHTTPOutageWithinDeadline(t *testing.T) {
	var n atomic.Int32
	s, _ := server(t, func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) <= 4 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, `{"result": [[{"document": {"id": "1", "contents": "back"}, "score": 1}]]}`)
	})
	cfg := fastCfg(s.URL)
	cfg.Retries = 2
	if _, err := newHTTPMust(t, cfg).Retrieve(context.Background(), []string{"q"}, 3); err == nil ||
		!strings.Contains(err.Error(), "2 of 2 tries") {
		t.Fatalf("without a deadline: err %v, want a failure after 2 tries", err)
	}
	n.Store(0)
	cfg.Deadline = 10 * time.Second
	docs, err := newHTTPMust(t, cfg).Retrieve(context.Background(), []string{"q"}, 3)
	if err != nil || len(docs) != 1 || docs[0][0].Contents != "back" {
		t.Fatalf("within the deadline: docs %+v err %v", docs, err)
	}
	if n.Load() != 5 {
		t.Errorf("%d requests, want 5 (4 failed, then the answer)", n.Load())
	}
}
