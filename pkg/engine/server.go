package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/llm"
)

// server is one replica of an engine and what the client knows of it.
type server struct {
	url       string
	served    string // model name the server reports (OpenAI-style protocols address it by name)
	inflight  int
	failures  int         // failed attempts in a row
	downUntil time.Time   // not chosen before this unless every replica is down
	version   llm.Version // weights version it confirmed serving (unknown before the first sync)
	out       bool        // out of rotation: it failed to load the current weights
	reloading bool        // loading the next weights ahead of the Sync that makes them current (ReloadIdle)
	// Rejoin's back-off for a replica out of rotation: failed attempts in a row, and no attempt
	// before rejoinAfter.
	rejoinFails int
	rejoinAfter time.Time
}

// acquire waits for a replica with a free slot: one not yet tried for this request and not marked
// down if possible, then the least loaded (round-robin among equals).
func (c *Client) acquire(ctx context.Context, tried []*server) (*server, error) {
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, none := c.pick(tried)
		if none {
			return nil, fmt.Errorf("%w: model %s: no replica of %s serves the current weights (every one failed to load them)",
				ErrUnavailable, c.model, strings.Join(c.URLs(), ", "))
		}
		if r != nil {
			r.inflight++
			return r, nil
		}
		c.cond.Wait()
	}
}

// pick chooses among replicas in rotation with a free slot (mu held): nil when all are full, none
// when no replica is in rotation.
func (c *Client) pick(tried []*server) (best *server, none bool) {
	now := time.Now()
	bestRank := math.MaxInt
	n := len(c.reps)
	none = true
	for k := 0; k < n; k++ {
		r := c.reps[(c.next+k)%n]
		if r.out || !c.serving(r) {
			continue
		}
		none = false
		if r.inflight >= c.cfg.MaxInflight {
			continue
		}
		rank := r.inflight
		if slices.Contains(tried, r) {
			rank += 1 << 30
		}
		if now.Before(r.downUntil) {
			rank += 1 << 20
		}
		if rank < bestRank {
			best, bestRank = r, rank
		}
	}
	if best != nil {
		c.next = (c.next + 1) % n
	}
	return best, none
}

// serving says whether r serves the current weights (mu held): not reloading ahead, and at the
// version of the last Sync (any before the first).
func (c *Client) serving(r *server) bool {
	return !r.reloading && (c.current == (llm.Version{}) || r.version == c.current)
}

// release frees r's slot and records the attempt's outcome.
func (c *Client) release(r *server, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.inflight--
	if err == nil {
		r.failures = 0
		r.downUntil = time.Time{}
	} else if _, bad := err.(*badRequestError); !bad {
		r.failures++
		r.downUntil = time.Now().Add(backoff(r.failures))
		log.Warn().Str("model", c.model).Str("replica", r.url).Int("failures", r.failures).Err(err).Msg("rollout engine replica failed; retrying on the others")
	}
	c.cond.Broadcast()
}

// check validates a parsed reply against the request: a reply that would silently corrupt training
// (no tokens, ids outside the vocabulary, log-probs missing or not finite, more tokens than asked,
// tokens after a stop token, a finish reason that contradicts the tokens) is a ReplyError.
func (c *Client) check(url string, res result, s llm.Sampling) error {
	bad := func(format string, args ...any) error {
		return &ReplyError{URL: url, Detail: fmt.Sprintf(format, args...)}
	}
	if len(res.ids) == 0 {
		return bad("no sampled tokens (finish %q)", res.finish)
	}
	if len(res.logps) != len(res.ids) {
		return bad("%d log-probs for %d sampled tokens", len(res.logps), len(res.ids))
	}
	if len(res.ids) > s.MaxNewTokens {
		return bad("%d tokens for max_new_tokens %d", len(res.ids), s.MaxNewTokens)
	}
	vocab := c.codec.Tok.VocabSize()
	for j, id := range res.ids {
		if id < 0 || id >= vocab {
			return bad("token %d: id %d outside the tokenizer's vocabulary [0, %d)", j, id, vocab)
		}
		if c.isStop(id) && j < len(res.ids)-1 {
			return bad("token %d is the stop token %d but %d more tokens follow", j, id, len(res.ids)-1-j)
		}
		if lp := float64(res.logps[j]); math.IsNaN(lp) || math.IsInf(lp, 0) || lp > 1e-3 {
			return bad("token %d: log-prob %g is not a finite value ≤ 0", j, lp)
		}
	}
	switch res.finish {
	case llm.FinishLength:
		if len(res.ids) != s.MaxNewTokens && !c.isStop(res.ids[len(res.ids)-1]) {
			return bad("finish \"length\" after %d tokens but max_new_tokens is %d", len(res.ids), s.MaxNewTokens)
		}
	case llm.FinishStop:
		last := res.ids[len(res.ids)-1]
		if !c.isStop(last) && !hasStop(c.codec.Tok.Decode(res.ids), s.Stop) {
			return bad("finish \"stop\" but the last token %d is no stop token and the text holds no stop string", last)
		}
	default:
		return bad("finish reason %q", res.finish)
	}
	return nil
}

// hasStop reports whether text holds one of the stop strings. Engines stop as soon as a stop string
// appears, which may be inside the last token (the local policy stops when the text ends with one).
func hasStop(text string, stops []string) bool {
	for _, s := range stops {
		if s != "" && strings.Contains(text, s) {
			return true
		}
	}
	return false
}
