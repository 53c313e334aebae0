package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rs/zerolog/log"
)

// Sync makes every replica load the weights folder dir (a Hugging Face model folder the replicas can
// read at that path) tagged version, and waits until they have. A replica that cannot be reached or
// fails to load is taken out of rotation (it rejoins at a later Sync that it survives); a replica
// that reports success but then serves another version is a StaleError, as is a failure of every
// replica (wrapping ErrUnavailable). Generation must not run while Sync does.
func (c *Client) Sync(ctx context.Context, dir, version string) error {
	errs := c.eachReplica(ctx, c.cfg.Timeout, func(ctx context.Context, r *replica) error {
		have, err := c.proto.reload(ctx, c.http, r.url, dir, version)
		if err == nil && have != "" && have != version {
			err = &StaleError{URL: r.url, Want: version, Have: have}
		}
		return err
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	var failed []string
	serving := 0
	for i, r := range c.reps {
		var stale *StaleError
		switch err := errs[i]; {
		case err == nil:
			r.version, r.out, r.failures = version, false, 0
			serving++
		case errors.As(err, &stale):
			return fmt.Errorf("model %s: %w", c.model, err)
		default:
			r.out = true
			failed = append(failed, fmt.Sprintf("%s: %v", r.url, err))
			log.Warn().Str("model", c.model).Str("replica", r.url).Str("version", version).Err(err).
				Msg("replica failed to load the new weights: out of rotation until a later sync succeeds")
		}
	}
	if serving == 0 {
		return fmt.Errorf("%w: model %s: no replica loaded weights %s (%s)", ErrUnavailable, c.model, version, strings.Join(failed, "; "))
	}
	return nil
}

// Versions returns the weights version each replica confirmed serving at the last Sync ("" for a
// replica out of rotation), keyed by URL.
func (c *Client) Versions() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for _, r := range c.reps {
		if r.out {
			out[r.url] = ""
		} else {
			out[r.url] = r.version
		}
	}
	return out
}
