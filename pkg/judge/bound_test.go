package judge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// endless writes a 2xx reply that never ends (a JSON string that keeps growing), counting the bytes
// it got to write: a client that stops reading at its bound closes the connection.
type endless struct{ written atomic.Int64 }

func (e *endless) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	chunk := []byte(strings.Repeat("x", 64<<10))
	n, _ := w.Write([]byte(`{"choices": [{"message": {"content": "`))
	e.written.Add(int64(n))
	for e.written.Load() < 1<<30 {
		n, err := w.Write(chunk)
		e.written.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// remoteConfig is the default remote section for url, batch trajectories per POST.
func remoteConfig(url string, batch int) RemoteConfig {
	c := Defaults().Remote
	c.URL, c.BatchSize = url, batch
	return c
}

// A judge or a remote endpoint that streams a huge reply: the client stops reading at its bound
// (MaxJudgeReplyBytes, MaxRemoteReplyBytes) and fails that call naming the URL and the bound, instead
// of holding 64 MiB per read (a 200 MB reply took a one-step run to 5.4 GB).
func TestReplyBound(t *testing.T) {
	for _, c := range []struct {
		who   string
		bound int64
		call  func(url string) error
	}{
		{"judge", MaxJudgeReplyBytes, func(url string) error {
			j := newJudge(t, judgeConfig(url+"/v1/chat/completions"))
			return j.Judge(context.Background(), []Input{{Question: "q", Answer: "a"}})[0].Err
		}},
		{"remote reward", MaxRemoteReplyBytes, func(url string) error {
			r, err := NewRemote(remoteConfig(url, 1))
			if err != nil {
				t.Fatal(err)
			}
			scores, _ := r.Score(context.Background(), []Trajectory{{ID: "t0"}})
			return scores[0].Err
		}},
	} {
		e := &endless{}
		srv := httptest.NewServer(e)
		err := c.call(srv.URL)
		srv.Close()
		var je *Error
		if !errors.As(err, &je) || je.Kind != KindTooLarge || !strings.Contains(err.Error(), srv.URL) ||
			!strings.Contains(err.Error(), fmt.Sprintf("%d bytes", c.bound)) {
			t.Errorf("%s: %v; want a too-large failure naming the URL and the bound (%d bytes)", c.who, err, c.bound)
		}
		if w := e.written.Load(); w > c.bound+8<<20 {
			t.Errorf("%s: the server wrote %d bytes before the client stopped reading (bound %d)", c.who, w, c.bound)
		}
	}
}

// A remote score that is absurd (1e300, or beyond ±MaxRemoteScore) is refused where it arrives, naming
// the endpoint and the trajectory; the batch's other trajectories keep their scores.
func TestRemoteScoreBound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"scores": [{"score": 1e300}, {"score": 0.5}, {"score": 1, "calls": [0.5, -2e7]}]}`)
	}))
	defer srv.Close()
	r, err := NewRemote(remoteConfig(srv.URL, 3))
	if err != nil {
		t.Fatal(err)
	}
	scores, _ := r.Score(context.Background(), []Trajectory{{ID: "t0"}, {ID: "t1"}, {ID: "t2", Calls: make([]Call, 2)}})
	for i, want := range []string{"trajectory t0: score 1e+300", "", "trajectory t2: calls[1] -2e+07"} {
		err := scores[i].Err
		if want == "" {
			if err != nil || scores[i].Score != 0.5 {
				t.Errorf("trajectory t%d: %+v", i, scores[i])
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), srv.URL) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "±1e+06") {
			t.Errorf("trajectory t%d: %+v; want a refusal naming the endpoint, %q and the bound", i, scores[i], want)
		}
	}
}
