package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/rs/zerolog/log"
)

// Sync makes every replica load the weights folder dir (a Hugging Face model folder the replicas can
// read at that path) tagged version, and waits until they have. A replica that cannot be reached or
// fails to load is taken out of rotation (it rejoins at a later Sync that it survives); a replica
// that reports success but then serves another version is a StaleError, as is a failure of every
// replica (wrapping ErrUnavailable). Generation must not run while Sync does.
func (c *Client) Sync(ctx context.Context, dir string, version llm.Version) error {
	wire := version.String()
	errs := c.eachReplica(ctx, c.cfg.Timeout, func(ctx context.Context, r *server) error {
		c.mu.Lock()
		early := r.version == version && !r.out && !r.reloading // loaded ahead (ReloadIdle)
		c.mu.Unlock()
		if early {
			return nil
		}
		have, err := c.proto.reload(ctx, c.http, r.url, dir, wire)
		if err == nil && have != "" && have != wire {
			err = &StaleError{URL: r.url, Want: wire, Have: have}
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
			log.Warn().Str("model", c.model).Str("replica", r.url).Str("version", wire).Err(err).
				Msg("replica failed to load the new weights: out of rotation until a later sync succeeds")
		}
	}
	if serving == 0 {
		return fmt.Errorf("%w: model %s: no replica loaded weights %s (%s)", ErrUnavailable, c.model, wire, strings.Join(failed, "; "))
	}
	c.current = version
	c.cond.Broadcast()
	return nil
}

// ReloadIdle loads weights version (folder dir) ahead of its Sync, a replica at a time, while a
// rollout still runs on the current weights: each replica in rotation with no request in flight
// that does not serve version yet loads it, as long as another replica still serves the current
// weights for the rollout's requests to come. A replica so reloaded takes no request until
// Sync(dir, version) makes version current (and Sync leaves it as it is), so every request is still
// answered by the weights it was meant for. It returns how many replicas it reloaded; a replica that
// fails to load leaves rotation, as in Sync.
func (c *Client) ReloadIdle(ctx context.Context, dir string, version llm.Version) (int, error) {
	wire := version.String()
	n := 0
	for {
		c.mu.Lock()
		var idle *server
		others := 0
		for _, r := range c.reps {
			if r.out || !c.serving(r) {
				continue
			}
			if r.inflight == 0 && r.version != version && idle == nil {
				idle = r
			} else {
				others++
			}
		}
		if idle == nil || others == 0 {
			c.mu.Unlock()
			return n, nil
		}
		idle.reloading = true
		c.mu.Unlock()

		rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		have, err := c.proto.reload(rctx, c.http, idle.url, dir, wire)
		cancel()
		if err == nil && have != "" && have != wire {
			err = &StaleError{URL: idle.url, Want: wire, Have: have}
		}
		c.mu.Lock()
		idle.reloading = false
		if err != nil {
			idle.out = true
		} else {
			idle.version = version
			n++
		}
		c.cond.Broadcast()
		c.mu.Unlock()
		if err != nil {
			return n, fmt.Errorf("model %s: replica %s: loading %s ahead: %w", c.model, idle.url, wire, err)
		}
	}
}

// Versions returns the weights version each replica confirmed serving at the last Sync (unknown for
// a replica out of rotation), keyed by URL.
func (c *Client) Versions() map[string]llm.Version {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]llm.Version{}
	for _, r := range c.reps {
		if r.out {
			out[r.url] = llm.Version{}
		} else {
			out[r.url] = r.version
		}
	}
	return out
}

// LoadAdapter makes every replica in rotation load the PEFT LoRA adapter folder dir (readable by
// the replicas at that path) under name, and waits until they have; requests then name it
// (GenerateAdapterIDs, or Generate with Model = name). Engines reload a same-name adapter
// unreliably (vLLM), so a new version of an adapter is best loaded under a new name and the old one
// unloaded. A replica that fails to load it is taken out of rotation (it rejoins at a later Sync it
// survives, without the adapter: load adapters again after such a Sync); a failure of every
// replica is an error wrapping ErrUnavailable, unless they all refused the request itself (a 4xx:
// a name taken, a folder outside the server's weights root), which is returned as it is.
func (c *Client) LoadAdapter(ctx context.Context, name, dir string) error {
	if name == "" || dir == "" {
		return fmt.Errorf("model %s: LoRA adapter: a name and a folder are required (got %q, %q)", c.model, name, dir)
	}
	errs := c.eachLive(ctx, func(ctx context.Context, r *server) error {
		return c.proto.loadAdapter(ctx, c.http, r.url, name, dir)
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	var failed []string
	var outNow []*server
	var refused error
	loaded := 0
	for i, r := range c.reps {
		switch err := errs[i]; {
		case r.out:
		case err == nil:
			loaded++
		default:
			var bad *badRequestError
			if errors.As(err, &bad) && refused == nil {
				refused = err
			}
			r.out = true
			outNow = append(outNow, r)
			failed = append(failed, fmt.Sprintf("%s: %v", r.url, err))
			log.Warn().Str("model", c.model).Str("replica", r.url).Str("lora", name).Err(err).
				Msg("replica failed to load the LoRA adapter: out of rotation until a later sync succeeds")
		}
	}
	if loaded == 0 {
		if refused != nil {
			for _, r := range outNow { // the request was wrong, not the replicas: keep them
				r.out = false
			}
			return fmt.Errorf("model %s: load LoRA adapter %s from %s: %w", c.model, name, dir, refused)
		}
		return fmt.Errorf("%w: model %s: no replica loaded LoRA adapter %s from %s (%s)", ErrUnavailable, c.model, name, dir, strings.Join(failed, "; "))
	}
	if c.adapters == nil {
		c.adapters = map[string]string{}
	}
	c.adapters[name] = dir
	return nil
}

// UnloadAdapter makes every replica in rotation drop the adapter name. New requests naming it are
// refused at once; requests already running on it finish. Replicas that fail to unload it stay in
// rotation (the adapter only holds their memory); their errors are returned joined.
func (c *Client) UnloadAdapter(ctx context.Context, name string) error {
	c.mu.Lock()
	delete(c.adapters, name)
	c.mu.Unlock()
	errs := c.eachLive(ctx, func(ctx context.Context, r *server) error {
		return c.proto.unloadAdapter(ctx, c.http, r.url, name)
	})
	var out []error
	for i, err := range errs {
		if err != nil {
			out = append(out, fmt.Errorf("model %s: replica %s: unload LoRA adapter %s: %w", c.model, c.reps[i].url, name, err))
		}
	}
	return errors.Join(out...)
}

// Adapters lists the LoRA adapters loaded through LoadAdapter and not unloaded, sorted.
func (c *Client) Adapters() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.adapters))
	for n := range c.adapters {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Verify asks every replica in rotation which weights version it serves, for a model whose weights
// are synced once (a frozen LoRA base): one that reports another version than want — a restart
// brought it back on its original weights, which would take the next adapter load without a word —
// leaves rotation, for Rejoin to reload. A replica that cannot tell ("") or does not answer is left
// as it is. It returns how many it took out.
func (c *Client) Verify(ctx context.Context, want llm.Version) int {
	have := make([]string, len(c.reps))
	c.eachLive(ctx, func(ctx context.Context, r *server) error {
		v, err := c.proto.version(ctx, c.http, r.url)
		if err == nil {
			c.mu.Lock()
			have[slices.Index(c.reps, r)] = v
			c.mu.Unlock()
		}
		return err
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i, r := range c.reps {
		if !r.out && have[i] != "" && have[i] != want.String() {
			r.out = true
			n++
			log.Warn().Str("model", c.model).Str("replica", r.url).Str("serving", have[i]).Str("want", want.String()).
				Msg("replica serves other weights than those synced (restarted?): out of rotation until it rejoins")
		}
	}
	return n
}

// Rejoin brings the replicas out of rotation back, for a model whose weights are synced once (a
// frozen LoRA base, which later Syncs never reload): each reloads the folder dir tagged version (the
// one the others serve) and then every adapter loaded through LoadAdapter and not unloaded (each
// unloaded first, in case the replica kept it); a replica that does all of it rejoins, one that
// fails stays out (logged) and is not tried again for a while (30 s, doubling to 30 min). A
// replica that restarted lost both, so without this it would stay out for good. The replicas are
// tried at once; it returns how many rejoined. Generation must not run while it does.
func (c *Client) Rejoin(ctx context.Context, dir string, version llm.Version) int {
	now := time.Now()
	c.mu.Lock()
	var out []*server
	for _, r := range c.reps {
		if r.out && !now.Before(r.rejoinAfter) {
			out = append(out, r)
		}
	}
	names := make([]string, 0, len(c.adapters))
	for n := range c.adapters {
		names = append(names, n)
	}
	adapters := maps.Clone(c.adapters)
	c.mu.Unlock()
	slices.Sort(names)
	errs := make([]error, len(out))
	var wg sync.WaitGroup
	for i, r := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.rejoin(ctx, r, dir, version, names, adapters)
		}()
	}
	wg.Wait()
	back := 0
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range out {
		if err := errs[i]; err != nil {
			r.rejoinFails++
			wait := min(30*time.Second<<min(r.rejoinFails-1, 6), 30*time.Minute)
			r.rejoinAfter = time.Now().Add(wait)
			log.Warn().Str("model", c.model).Str("replica", r.url).Str("version", version.String()).Err(err).Dur("next_try_in", wait).
				Msg("replica out of rotation could not reload the weights and adapters: still out")
			continue
		}
		r.version, r.out, r.failures, r.rejoinFails, r.rejoinAfter = version, false, 0, 0, time.Time{}
		back++
		log.Info().Str("model", c.model).Str("replica", r.url).Str("version", version.String()).Int("adapters", len(names)).
			Msg("replica back in rotation: weights and adapters reloaded")
	}
	return back
}

// rejoin reloads dir (version) and the adapters names on one replica, each call with its own timeout.
func (c *Client) rejoin(ctx context.Context, r *server, dir string, version llm.Version, names []string, adapters map[string]string) error {
	wire := version.String()
	timed := func(f func(context.Context) error) error {
		call, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		return f(call)
	}
	err := timed(func(call context.Context) error {
		have, err := c.proto.reload(call, c.http, r.url, dir, wire)
		if err == nil && have != "" && have != wire {
			err = &StaleError{URL: r.url, Want: wire, Have: have}
		}
		return err
	})
	for _, n := range names {
		if err != nil {
			break
		}
		_ = timed(func(call context.Context) error { return c.proto.unloadAdapter(call, c.http, r.url, n) }) // gone after a restart
		err = timed(func(call context.Context) error { return c.proto.loadAdapter(call, c.http, r.url, n, adapters[n]) })
	}
	return err
}

// eachLive is eachReplica on the replicas in rotation (nil errors for the others).
func (c *Client) eachLive(ctx context.Context, f func(context.Context, *server) error) []error {
	c.mu.Lock()
	live := make([]bool, len(c.reps))
	for i, r := range c.reps {
		live[i] = !r.out
	}
	c.mu.Unlock()
	idx := map[*server]int{}
	for i, r := range c.reps {
		idx[r] = i
	}
	return c.eachReplica(ctx, c.cfg.Timeout, func(ctx context.Context, r *server) error {
		if !live[idx[r]] {
			return nil
		}
		return f(ctx, r)
	})
}
