package judge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
)

// Trajectory is one trajectory as the remote reward endpoint receives it (docs/contracts.md).
type Trajectory struct {
	ID         string   `json:"id"`    // unique in the rollout (the trajectory's uid)
	Group      string   `json:"group"` // the task's prompt group: the group_size trajectories of one task share it
	TaskID     string   `json:"task_id"`
	Sample     int      `json:"sample"`
	Question   string   `json:"question"`
	Reference  string   `json:"reference"`  // the gold answers joined with " | "
	References []string `json:"references"` // the gold answers
	Answer     string   `json:"answer"`     // the team's final answer ("" when none)
	Answered   bool     `json:"answered"`
	Calls      []Call   `json:"calls"` // in order
}

// Call is one agent call of a Trajectory.
type Call struct {
	Agent  string `json:"agent"`
	Turn   int    `json:"turn"`
	Text   string `json:"text"`   // the agent's response
	Parsed string `json:"parsed"` // what the orchestra read from it (answer, verdict, query)
	Valid  bool   `json:"valid"`  // whether it had the form the orchestra asks for
}

// remoteRequest is the body of one POST.
type remoteRequest struct {
	Trajectories []Trajectory `json:"trajectories"`
}

// Score is the remote endpoint's score of one trajectory.
type Score struct {
	Score float64   `json:"score"`
	Calls []float64 `json:"calls,omitempty"` // per call, optional
	Err   error     `json:"-"`               // the failure of its POST
}

type remoteReply struct {
	Scores []struct {
		Score *float64  `json:"score"`
		Calls []float64 `json:"calls"`
	} `json:"scores"`
}

// Remote posts trajectories to a reward endpoint, batch_size per POST, and reads back their scores.
// Safe for concurrent use.
type Remote struct {
	cfg RemoteConfig
	c   *client
}

// NewRemote checks cfg and returns a remote reward. The key, when api_key_env is set, is read now.
func NewRemote(cfg RemoteConfig) (*Remote, error) {
	if err := (Config{Type: TypeRemote, Remote: cfg}).Validate(); err != nil {
		return nil, err
	}
	c, err := newClient("remote reward", cfg.URL, cfg.Endpoint, MaxRemoteReplyBytes)
	if err != nil {
		return nil, err
	}
	return &Remote{cfg: cfg, c: c}, nil
}

// URL is the endpoint.
func (r *Remote) URL() string { return r.c.url }

// Score sends the trajectories in POSTs of batch_size, max_concurrency at a time, and returns one
// score per trajectory, aligned, and the number of POSTs. A failed POST is the Err of each of its
// trajectories: Score itself never fails.
func (r *Remote) Score(ctx context.Context, trajs []Trajectory) ([]Score, int) {
	out := make([]Score, len(trajs))
	var wg sync.WaitGroup
	posts := 0
	for lo := 0; lo < len(trajs); lo += r.cfg.BatchSize {
		hi := min(lo+r.cfg.BatchSize, len(trajs))
		posts++
		wg.Add(1)
		go func() {
			defer wg.Done()
			scores, err := r.post(ctx, trajs[lo:hi])
			for i := lo; i < hi; i++ {
				if err != nil {
					out[i].Err = err
				} else {
					out[i] = scores[i-lo]
				}
			}
		}()
	}
	wg.Wait()
	return out, posts
}

// post sends one batch and checks the reply against it.
func (r *Remote) post(ctx context.Context, trajs []Trajectory) ([]Score, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(remoteRequest{Trajectories: trajs}); err != nil {
		return nil, fmt.Errorf("remote reward: encode: %w", err)
	}
	b, err := r.c.post(ctx, buf.Bytes())
	if err != nil {
		return nil, err
	}
	malformed := func(format string, args ...any) error {
		return &Error{Who: "remote reward", Endpoint: r.c.url, Kind: KindMalformed, Err: fmt.Errorf(format, args...), Snippet: snippet(string(b))}
	}
	var rep remoteReply
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, malformed("not the JSON of a reply {\"scores\": [...]}: %v", err)
	}
	if len(rep.Scores) != len(trajs) {
		return nil, malformed("%d scores for %d trajectories", len(rep.Scores), len(trajs))
	}
	out := make([]Score, len(trajs))
	for i, s := range rep.Scores {
		if s.Score == nil {
			return nil, malformed("scores[%d] has no \"score\"", i)
		}
		if s.Calls != nil && len(s.Calls) != len(trajs[i].Calls) {
			return nil, malformed("scores[%d].calls has %d scores for the trajectory's %d calls", i, len(s.Calls), len(trajs[i].Calls))
		}
		out[i] = Score{Score: *s.Score, Calls: s.Calls}
		if err := checkScore(*s.Score, s.Calls); err != nil {
			// This trajectory's score is refused; the batch's others stand.
			out[i] = Score{Err: &Error{Who: "remote reward", Endpoint: r.c.url, Kind: KindMalformed,
				Err: fmt.Errorf("trajectory %s: %w", trajs[i].ID, err)}}
		}
	}
	return out, nil
}

// MaxRemoteScore bounds the magnitude of a remote reward's scores (a trajectory's and its calls'):
// rewards are a few units at most, and a score past it (1e300 from a broken endpoint) would swamp
// every advantage of its group, or overflow the normalization's sums later.
const MaxRemoteScore = 1e6

// checkScore refuses a score, or a call's score, that is not finite or is beyond ±MaxRemoteScore.
func checkScore(score float64, calls []float64) error {
	bad := func(v float64) bool { return math.IsNaN(v) || !(math.Abs(v) <= MaxRemoteScore) }
	if bad(score) {
		return fmt.Errorf("score %g is not a finite number within ±%g (reward.remote scores are bounded)", score, float64(MaxRemoteScore))
	}
	for k, v := range calls {
		if bad(v) {
			return fmt.Errorf("calls[%d] %g is not a finite number within ±%g (reward.remote scores are bounded)", k, v, float64(MaxRemoteScore))
		}
	}
	return nil
}
