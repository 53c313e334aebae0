package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/metric"
)

// Model is what a Fleet needs of one of a run's models: its id, where it samples (Rollout; an
// adapter samples where its Base does), how its prompts are tokenized (Codec), its in-process
// generator (engine local), where managed replicas run it (Device, DType) and how its current weights
// are written (Save: a model folder, or an adapter's PEFT folder; the caller runs it where tensors
// may be touched).
type Model struct {
	ID      string
	Base    string // an adapter's frozen base ("" for a full model)
	Rollout Config
	Device  string
	DType   string
	Codec   Codec
	Local   llm.Generator
	Save    func(dir string) error
}

// Group is the data-parallel group a fleet serves: rank 0 syncs the engines while the other ranks
// wait at a barrier, then route alike.
type Group interface {
	Rank() int
	Size() int
	Barrier() error
}

// Options are a fleet's surroundings: the run folder (the published weights and the managed
// replicas live under it), the data-parallel group, how managed replicas are launched, and what
// rollouts sample with when every model is local (the policies' router).
type Options struct {
	Run    string
	Group  Group
	Launch Launcher
	Local  llm.Generator
}

// Fleet keeps a run's serving engines (models[].rollout) serving the weights being trained: the
// engine clients of the served models, the frozen bases that serve their LoRA adapters, the managed
// replicas it started, and the generator rollouts and validation sample with. Rank 0 publishes new
// weights and the engines load them (Sync); with rollouts running ahead, replicas take the newest
// weights in turn while a rollout still runs (ReloadAhead). A frozen base is synced once; its
// adapters every time, each version under a new name (Publisher.AdapterVersion).
type Fleet struct {
	models  map[string]Model   // the trained models, by id
	order   []string           // their ids, sorted
	clients map[string]*Client // by trained model id (an adapter's is its base's)
	bases   map[string]*Client // frozen bases with an engine, by id
	frozen  map[string]Model   // those bases
	gen     llm.Generator
	pub     *Publisher
	group   Group
	synced  int // the step the engines serve (-1: none yet)
	seconds float64

	basesSynced   map[string]published   // each frozen base's one synced version
	adapterServed map[string]llm.Version // each adapter's version loaded on its base's engine
	written       map[string]published   // weights published ahead of their sync (ReloadAhead)
	reloadedAhead map[string]int         // replicas that loaded them early since the last metrics
	managed       *managed
}

// published is a folder of weights and its version.
type published struct {
	dir string
	v   llm.Version
}

// Open connects the engines of the models that sample on them (trained models, and frozen bases
// whose adapters do), starting managed replicas first: an engine that does not answer is an error
// naming its URL, before any training. bases are the frozen bases of adapters.
func Open(ctx context.Context, models, bases []Model, opt Options) (*Fleet, error) {
	f := &Fleet{models: map[string]Model{}, clients: map[string]*Client{}, bases: map[string]*Client{}, frozen: map[string]Model{},
		pub: NewPublisher(opt.Run), group: opt.Group, synced: -1, basesSynced: map[string]published{},
		adapterServed: map[string]llm.Version{}, written: map[string]published{}, reloadedAhead: map[string]int{},
		managed: newManaged(opt.Run, opt.Launch)}
	if f.group == nil {
		f.group = single{}
	}
	for _, b := range bases {
		if !b.Rollout.Served() {
			continue
		}
		c, err := f.connect(ctx, b)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.bases[b.ID], f.frozen[b.ID] = c, b
	}
	router := Router{}
	for _, m := range models {
		f.models[m.ID] = m
		f.order = append(f.order, m.ID)
		if c := f.bases[m.Base]; c != nil && m.Base != "" {
			f.clients[m.ID], router[m.ID] = c, c
			log.Info().Str("model", m.ID).Str("base", m.Base).Str("engine", c.Engine()).Strs("urls", c.URLs()).Msg("LoRA adapter served by its base's rollout engine")
			continue
		}
		if !m.Rollout.Served() {
			router[m.ID] = m.Local
			continue
		}
		c, err := f.connect(ctx, m)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.clients[m.ID], router[m.ID] = c, c
	}
	sort.Strings(f.order)
	f.gen = router
	if len(f.clients) == 0 {
		f.gen = opt.Local // all local: the policies' router, exactly as before
	}
	return f, nil
}

// connect connects model m's engine, tokenizing with its codec; for engine managed it first starts
// the replicas (managed.go).
func (f *Fleet) connect(ctx context.Context, m Model) (*Client, error) {
	r := m.Rollout
	if r.Engine == Managed {
		if f.group.Size() > 1 {
			return nil, fmt.Errorf("models[%s].rollout.engine: managed replicas run beside one process; with %d ranks, start drmas serve replicas yourself and name them in urls (engine: sglang)",
				m.ID, f.group.Size())
		}
		var err error
		if r, err = f.managed.start(ctx, m); err != nil {
			return nil, err
		}
	}
	key := r.APIKey
	if key == "" {
		key = os.Getenv("DRMAS_API_KEY")
	}
	r.APIKey = key
	c, err := New(ctx, m.ID, r, m.Codec)
	if err != nil {
		return nil, fmt.Errorf("models[%s].rollout: %w", m.ID, err)
	}
	log.Info().Str("model", m.ID).Str("engine", r.Engine).Strs("urls", c.URLs()).Msg("rollout engine connected")
	return c, nil
}

// Generator is what rollouts and validation sample with: the engines' clients for the served
// models, the local policies for the others.
func (f *Fleet) Generator() llm.Generator { return f.gen }

// Serves says whether model id samples on a serving engine.
func (f *Fleet) Serves(id string) bool { return f.clients[id] != nil }

// Sync brings the engines to the weights of step before a rollout: rank 0 publishes them
// (Publish), the other ranks wait for it and route adapters alike, so no rank samples on stale
// weights. A managed replica being restarted comes back first.
func (f *Fleet) Sync(ctx context.Context, step int) error {
	if err := f.managed.ready(ctx); err != nil {
		return err
	}
	if f.group.Rank() == 0 {
		if err := f.Publish(ctx, step); err != nil {
			return err
		}
	}
	if f.group.Size() > 1 && len(f.clients) > 0 {
		if err := f.group.Barrier(); err != nil {
			return err
		}
		if f.group.Rank() != 0 { // rank 0 loaded each adapter's version under its step's name
			for _, id := range f.order {
				if c := f.clients[id]; c != nil && f.models[id].Base != "" {
					c.Route(id, f.pub.AdapterVersion(id, step))
				}
			}
		}
	}
	return nil
}

// Publish makes every engine serve the weights of step (the last completed iteration) before
// anything samples from them: the first time after any warm-up (or resume), then after each update.
// A frozen base is synced once (a replica out of rotation reloads it and the current adapters,
// Client.Rejoin); its adapters every time, as PEFT folders loaded under a new name, their requests
// switched to it, the previous unloaded. Rank 0 (or one process) only.
func (f *Fleet) Publish(ctx context.Context, step int) error {
	if len(f.clients) == 0 || f.synced == step {
		return nil
	}
	began := time.Now()
	v := llm.StepVersion(step)
	if err := f.syncBases(ctx, v); err != nil {
		return err
	}
	for _, id := range f.order {
		c, m := f.clients[id], f.models[id]
		if c == nil {
			continue
		}
		if m.Base != "" {
			if err := f.syncAdapter(ctx, m, c, step); err != nil {
				return err
			}
			continue
		}
		if err := f.syncModel(ctx, m, c, v); err != nil {
			return err
		}
	}
	f.synced = step
	f.seconds += time.Since(began).Seconds()
	return nil
}

// syncBases syncs each frozen base once; later, replicas serving other weights (a restart) leave
// rotation and those out of rotation get the base and the current adapters again.
func (f *Fleet) syncBases(ctx context.Context, v llm.Version) error {
	ids := make([]string, 0, len(f.bases))
	for id := range f.bases {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if s, ok := f.basesSynced[id]; ok {
			f.bases[id].Verify(ctx, s.v)
			f.bases[id].Rejoin(ctx, s.dir, s.v)
			continue
		}
		dir, err := f.pub.Write(id, v, f.frozen[id].Save)
		if err != nil {
			return err
		}
		if err := f.bases[id].Sync(ctx, dir, v); err != nil {
			return fmt.Errorf("weight sync of the frozen base %s: %w", id, err)
		}
		f.managed.served(id, dir, v)
		f.pub.Prune(id, v)
		f.basesSynced[id] = published{dir, v}
	}
	return nil
}

// syncModel makes model m's replicas load version v: the folder ReloadAhead published, or one
// written now. A managed replica that died during the reload is waited for and synced again.
func (f *Fleet) syncModel(ctx context.Context, m Model, c *Client, v llm.Version) error {
	dir := f.written[m.ID].dir
	if f.written[m.ID].v != v {
		var err error
		if dir, err = f.pub.Write(m.ID, v, m.Save); err != nil {
			return err
		}
	}
	err := c.Sync(ctx, dir, v)
	for try := 1; f.managed.has(m.ID) && try <= 3 && errors.Is(err, ErrUnavailable); try++ {
		// a managed replica that died during the reload is being restarted: once it answers again
		// (serving the previous weights), the sync is tried again
		log.Warn().Str("model", m.ID).Str("version", v.String()).Int("try", try).Err(err).
			Msg("weight sync failed on every replica: waiting for the managed replicas to restart, then syncing again")
		time.Sleep(time.Duration(try) * 250 * time.Millisecond) // the supervisor sees the death
		if err = f.managed.ready(ctx, m.ID); err == nil {
			err = c.Sync(ctx, dir, v)
		}
	}
	if err != nil {
		return fmt.Errorf("weight sync of model %s to %s: %w", m.ID, v, err)
	}
	f.managed.served(m.ID, dir, v)
	f.pub.Prune(m.ID, v)
	log.Debug().Str("model", m.ID).Str("version", v.String()).Any("replicas", c.Versions()).Msg("engines serve the new weights")
	return nil
}

// syncAdapter makes the base's engine serve adapter m's weights of step: its PEFT folder published,
// loaded under a new name, the adapter's requests routed there, the previous version unloaded and
// its folder removed.
func (f *Fleet) syncAdapter(ctx context.Context, m Model, c *Client, step int) error {
	v := f.pub.AdapterVersion(m.ID, step)
	dir, err := f.pub.Write(m.ID, v, m.Save)
	if err != nil {
		return err
	}
	old := f.adapterServed[m.ID]
	err = c.LoadAdapter(ctx, v.Adapter, dir)
	if err != nil && !errors.Is(err, ErrUnavailable) && c.UnloadAdapter(ctx, v.Adapter) == nil {
		// Refused, and the name was loaded: an earlier process of this run left it (a resume
		// behind where it got). Replace it.
		log.Warn().Str("model", m.ID).Str("lora", v.Adapter).Msg("an adapter of this name was loaded already (an earlier process of this run): replaced")
		err = c.LoadAdapter(ctx, v.Adapter, dir)
	}
	if err != nil {
		return fmt.Errorf("adapter sync of model %s to %s: %w", m.ID, llm.StepVersion(step), err)
	}
	c.Route(m.ID, v)
	f.adapterServed[m.ID] = v
	if old.Adapter != "" && old != v {
		if err := c.UnloadAdapter(ctx, old.Adapter); err != nil {
			log.Warn().Str("model", m.ID).Str("lora", old.Adapter).Err(err).Msg("could not unload the previous adapter version (it holds the engine's memory until it restarts)")
		}
	}
	f.pub.Prune(m.ID, v)
	log.Debug().Str("model", m.ID).Str("lora", v.Adapter).Str("dir", dir).Msg("engines serve the adapter's new version")
	return nil
}

// ReloadAhead brings the weights of step (just updated, not yet synced) to the replicas in turn
// while a rollout generated ahead still runs (running closes when it ends): each full model with
// several replicas publishes its folder now, and every replica with nothing in flight loads it, as
// long as another one still serves the rollout's weights (Client.ReloadIdle); the sync after the
// rollout then reloads only the rest. One process only: data-parallel ranks route their requests by
// their own clients, which would not see a replica change version.
func (f *Fleet) ReloadAhead(ctx context.Context, step int, running <-chan struct{}) {
	if running == nil || f.group.Size() > 1 {
		return
	}
	began := time.Now()
	v := llm.StepVersion(step)
	dirs := map[string]string{}
	for _, id := range f.order {
		c, m := f.clients[id], f.models[id]
		if c == nil || m.Base != "" || len(c.URLs()) < 2 {
			continue
		}
		dir, err := f.pub.Write(id, v, m.Save)
		if err != nil {
			log.Warn().Str("model", id).Err(err).Msg("weights for the replicas not written ahead: they load at the sync")
			continue
		}
		f.written[id] = published{dir, v}
		dirs[id] = dir
	}
	f.seconds += time.Since(began).Seconds()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for len(dirs) > 0 {
		for id, dir := range dirs {
			n, err := f.clients[id].ReloadIdle(ctx, dir, v)
			f.reloadedAhead[id] += n
			if err != nil {
				log.Warn().Str("model", id).Err(err).Msg("a replica failed to load the new weights ahead: out of rotation until the sync")
				delete(dirs, id)
			}
		}
		select {
		case <-running:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Metrics adds how long weight syncs took since the last call (time/weight_sync) and, per
// engine-served model, how many replicas serve the current weights (rollout/replicas/<model>), how
// many loaded the update's weights ahead, and how often managed replicas restarted.
func (f *Fleet) Metrics(m map[string]float64) {
	if len(f.clients) == 0 {
		return
	}
	m["time/weight_sync"] = f.seconds
	f.seconds = 0
	f.managed.metrics(m)
	for id, n := range f.reloadedAhead {
		m[metric.ReloadedAheadModel(id)] = float64(n)
		f.reloadedAhead[id] = 0
	}
	want := llm.StepVersion(f.synced)
	for id, c := range f.clients {
		n := 0
		for _, v := range c.Versions() {
			// An adapter's replicas serve its base's one version (synced once) and its latest one; a
			// replica that loaded the update's weights ahead of the sync (ReloadAhead) serves the newest.
			if v == want || (f.adapterServed[id].Adapter != "" && v.Known) || (v.Known && v == f.written[id].v) {
				n++
			}
		}
		m["rollout/replicas/"+id] = float64(n)
	}
}

// Close unloads the run's adapter versions from the engines (rank 0 loaded them: a run, finished or
// failed, leaves no adapter holding an engine's memory; each checkpoint holds the adapters) and
// stops the managed replicas.
func (f *Fleet) Close() {
	if f == nil {
		return
	}
	if len(f.adapterServed) > 0 && f.group.Rank() == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ids := make([]string, 0, len(f.adapterServed))
		for id := range f.adapterServed {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			if c := f.clients[id]; c != nil {
				if err := c.UnloadAdapter(ctx, f.adapterServed[id].Adapter); err != nil {
					log.Warn().Str("model", id).Str("lora", f.adapterServed[id].Adapter).Err(err).Msg("could not unload the run's last adapter version from the engines")
				}
			}
			delete(f.adapterServed, id)
		}
	}
	f.managed.close()
}

// single is the group of one process.
type single struct{}

func (single) Rank() int      { return 0 }
func (single) Size() int      { return 1 }
func (single) Barrier() error { return nil }
