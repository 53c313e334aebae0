package train

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/replica"
	"github.com/drmas/drmas/pkg/torch"
)

// WeightsDir is the folder under run.dir where the weights served to rollout engines are written (a
// name rundir.go knows as drmas's):
// <run>/weights/<model>/v<step>, the latest version only.
const WeightsDir = "weights"

// engineSync keeps the rollout engines (models[].rollout) serving the weights being trained: the
// generator rollouts and validation sample with, the engine clients by model id, the step whose
// weights the engines serve (-1: none yet) and the seconds spent syncing since the last metrics row.
// For LoRA adapters on an engine-served frozen base: the base's client by base id, the folder and
// version each base was synced from (once: frozen after the warm-up; kept for replicas that rejoin),
// and the name each adapter's latest version is loaded under on its base's engine. Rank 0 syncs; the
// other ranks of a data-parallel group wait for it and route alike.
type engineSync struct {
	cfg     *config.Config
	router  policy.Router
	dir     string      // the run folder: the weights for the engines go under <dir>/weights
	group   *c10d.Group // nil: one process
	gen     llm.Generator
	clients map[string]*engine.Client
	synced  int
	seconds float64

	bases         map[string]*engine.Client
	basesSynced   map[string][2]string
	adapterServed map[string]string

	// Managed replicas (engine: managed) by model id, how they are launched, and the folder and
	// version each model's engines were last synced to (a restarted replica starts from it).
	managed map[string]*replica.Set
	stale   bool // rollouts run ahead of training (rollout.max_staleness): served log-probs lag by design
	launch  replica.Launcher
	served  map[string][2]string
	mu      sync.Mutex // guards served (read by the replicas' supervisors)

	// Weights written ahead of their sync (reloadAhead): the folder and version by model id, and how
	// many replicas loaded them early since the last metrics row.
	written       map[string][2]string
	reloadedAhead map[string]int
}

// connectEngines connects the models whose rollouts run on serving engines (models[].rollout) and
// builds the generator the orchestra samples with: those clients and the local policies of the
// other models. An engine that does not answer is an error naming its URL, before any training.
// A frozen base with an engine serves its LoRA adapters: each adapter's requests go to the base's
// client, routed to the name its latest version is loaded under (ensure).
func connectEngines(ctx context.Context, team *Team, models []*modelState, dir string, group *c10d.Group, launch replica.Launcher) (*engineSync, error) {
	e := &engineSync{cfg: team.Config, router: team.Router, dir: dir, group: group, clients: map[string]*engine.Client{},
		bases: map[string]*engine.Client{}, basesSynced: map[string][2]string{}, adapterServed: map[string]string{}, synced: -1,
		managed: map[string]*replica.Set{}, launch: launch, served: map[string][2]string{},
		written: map[string][2]string{}, reloadedAhead: map[string]int{}}
	router := engine.Router{}
	for _, mc := range e.cfg.Models {
		if !e.cfg.IsFrozenBase(mc.ID) || mc.Rollout.Engine == "" || mc.Rollout.Engine == engine.Local {
			continue
		}
		c, err := e.connect(ctx, mc.ID, mc, e.router[mc.ID])
		if err != nil {
			e.close()
			return nil, err
		}
		e.bases[mc.ID] = c
	}
	for _, ms := range models {
		if c := e.bases[ms.cfg.Base]; c != nil && ms.cfg.IsAdapter() {
			e.clients[ms.id], router[ms.id] = c, c
			log.Info().Str("model", ms.id).Str("base", ms.cfg.Base).Str("engine", c.Engine()).Strs("urls", c.URLs()).Msg("LoRA adapter served by its base's rollout engine")
			continue
		}
		r := ms.cfg.Rollout
		if r.Engine == "" || r.Engine == engine.Local {
			router[ms.id] = ms.pol
			continue
		}
		c, err := e.connect(ctx, ms.id, ms.cfg, ms.pol)
		if err != nil {
			e.close()
			return nil, err
		}
		e.clients[ms.id] = c
		router[ms.id] = c
	}
	e.gen = router
	if len(e.clients) == 0 {
		e.gen = e.router // all local: the policy router, exactly as before
	}
	return e, nil
}

// connect connects the engine of model id (its rollout section), tokenizing as pol does; for engine
// managed it first starts the replicas (managed.go).
func (e *engineSync) connect(ctx context.Context, id string, mc config.ModelConfig, pol *policy.Policy) (*engine.Client, error) {
	r := mc.Rollout
	if r.Engine == engine.Managed {
		var err error
		if r, err = e.startManaged(ctx, id, mc, pol); err != nil {
			return nil, err
		}
	}
	key := r.APIKey
	if key == "" {
		key = os.Getenv("DRMAS_API_KEY")
	}
	c, err := engine.New(ctx, id, engine.Config{Engine: r.Engine, URLs: r.URLs, MaxInflight: r.MaxInflight,
		Timeout: r.Timeout, Retries: r.Retries, APIKey: key}, engine.Codec{Prompt: pol.EncodePromptWith, Tok: pol.Tok, StopIDs: pol.StopIDs})
	if err != nil {
		return nil, fmt.Errorf("models[%s].rollout: %w", id, err)
	}
	log.Info().Str("model", id).Str("engine", r.Engine).Strs("urls", c.URLs()).Msg("rollout engine connected")
	return c, nil
}

// servedAdapter is the name an engine serves adapter id's weights of step under: a new name per
// version (engines reload a same-name adapter unreliably: SkyRL#1606, vllm#42125), tagged with the
// run folder so that runs sharing a server do not collide (id@step.tag). Every rank names alike.
func (e *engineSync) servedAdapter(id string, step int) string {
	abs, err := filepath.Abs(e.dir)
	if err != nil {
		abs = e.dir
	}
	sum := sha256.Sum256([]byte(abs))
	return fmt.Sprintf("%s@%d.%x", id, step, sum[:4])
}

// generator is what rollouts and validation sample with.
func (e *engineSync) generator() llm.Generator { return e.gen }

// ensure makes every engine serve the weights of the last completed iteration (step) before
// anything samples from it: the first time after any warm-up (or resume), then after each update.
// A frozen base is synced once (the warm-up is behind it; a replica out of rotation reloads it and
// the current adapters, Client.Rejoin); its adapters every time, as PEFT folders loaded under a new
// name (servedAdapter), their requests switched to it, the previous unloaded.
func (e *engineSync) ensure(ctx context.Context, step int, models []*modelState) error {
	if len(e.clients) == 0 || e.synced == step {
		return nil
	}
	began := time.Now()
	version := "v" + strconv.Itoa(step)
	bases := make([]string, 0, len(e.bases))
	for id := range e.bases {
		bases = append(bases, id)
	}
	sort.Strings(bases)
	for _, id := range bases {
		if synced, ok := e.basesSynced[id]; ok {
			// Replicas serving other weights (a restart) leave rotation; those out of rotation (that,
			// or a failed load) get the base and the current adapters again; this iteration's
			// adapters are loaded on them below.
			e.bases[id].Verify(ctx, synced[1])
			e.bases[id].Rejoin(ctx, synced[0], synced[1])
			continue
		}
		pol := e.router[id]
		dir, err := e.writeFolder(id, version, pol.Save)
		if err != nil {
			return err
		}
		if err := e.bases[id].Sync(ctx, dir, version); err != nil {
			return fmt.Errorf("weight sync of the frozen base %s: %w", id, err)
		}
		e.setServed(id, dir, version)
		e.pruneWeights(id, version)
		e.basesSynced[id] = [2]string{dir, version}
	}
	for _, ms := range models {
		c := e.clients[ms.id]
		if c == nil {
			continue
		}
		if ms.cfg.IsAdapter() {
			if err := e.syncAdapter(ctx, ms, c, step, version); err != nil {
				return err
			}
			continue
		}
		dir, err := e.folder(ms, version)
		if err != nil {
			return err
		}
		err = c.Sync(ctx, dir, version)
		_, managed := e.managed[ms.id]
		for try := 1; managed && try <= 3 && errors.Is(err, engine.ErrUnavailable); try++ {
			// a managed replica that died during the reload is being restarted: once it answers again
			// (serving the previous weights), the sync is tried again
			log.Warn().Str("model", ms.id).Str("version", version).Int("try", try).Err(err).
				Msg("weight sync failed on every replica: waiting for the managed replicas to restart, then syncing again")
			time.Sleep(time.Duration(try) * 250 * time.Millisecond) // the supervisor sees the death
			if err = e.ready(ctx, ms.id); err == nil {
				err = c.Sync(ctx, dir, version)
			}
		}
		if err != nil {
			return fmt.Errorf("weight sync of model %s to %s: %w", ms.id, version, err)
		}
		e.setServed(ms.id, dir, version)
		e.pruneWeights(ms.id, version)
		log.Debug().Str("model", ms.id).Str("version", version).Any("replicas", c.Versions()).Msg("engines serve the new weights")
	}
	e.synced = step
	e.seconds += time.Since(began).Seconds()
	return nil
}

// folder is model ms's weights folder of version for the engines: the one reloadAhead wrote, or
// written now.
func (e *engineSync) folder(ms *modelState, version string) (string, error) {
	if a := e.written[ms.id]; a[1] == version {
		return a[0], nil
	}
	return e.writeFolder(ms.id, version, ms.pol.Save)
}

// reloadAhead brings the weights of step (just updated, not yet synced) to the replicas in turn while
// the rollout generated ahead still runs (done closes when it ends): each full model with several
// replicas writes its folder now, and every replica with nothing in flight loads it, as long as
// another one still serves the rollout's weights (engine.Client.ReloadIdle); the sync after the
// rollout then reloads only the rest. One process only: data-parallel ranks route their requests by
// their own clients, which would not see a replica change version. Rank 0 of one process, after the
// update.
func (e *engineSync) reloadAhead(ctx context.Context, step int, models []*modelState, done <-chan struct{}) {
	if done == nil || e.group.Size() > 1 {
		return
	}
	began := time.Now()
	version := "v" + strconv.Itoa(step)
	dirs := map[string]string{}
	for _, ms := range models {
		c := e.clients[ms.id]
		if c == nil || ms.cfg.IsAdapter() || len(c.URLs()) < 2 {
			continue
		}
		dir, err := e.writeFolder(ms.id, version, ms.pol.Save)
		if err != nil {
			log.Warn().Str("model", ms.id).Err(err).Msg("weights for the replicas not written ahead: they load at the sync")
			continue
		}
		e.written[ms.id] = [2]string{dir, version}
		dirs[ms.id] = dir
	}
	e.seconds += time.Since(began).Seconds()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for len(dirs) > 0 {
		for id, dir := range dirs {
			n, err := e.clients[id].ReloadIdle(ctx, dir, version)
			e.reloadedAhead[id] += n
			if err != nil {
				log.Warn().Str("model", id).Err(err).Msg("a replica failed to load the new weights ahead: out of rotation until the sync")
				delete(dirs, id)
			}
		}
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// syncAdapter makes the base's engine serve adapter ms's current weights: its PEFT folder written
// under the weights folder, loaded under servedAdapter(id, step), the adapter's requests routed
// there, the previous version unloaded and its folder removed.
func (e *engineSync) syncAdapter(ctx context.Context, ms *modelState, c *engine.Client, step int, version string) error {
	a := ms.pol.Model.Adapter()
	dir, err := e.writeFolder(ms.id, version, a.Save)
	if err != nil {
		return err
	}
	name, old := e.servedAdapter(ms.id, step), e.adapterServed[ms.id]
	err = c.LoadAdapter(ctx, name, dir)
	if err != nil && !errors.Is(err, engine.ErrUnavailable) && c.UnloadAdapter(ctx, name) == nil {
		// Refused, and the name was loaded: an earlier process of this run left it (a resume
		// behind where it got). Replace it.
		log.Warn().Str("model", ms.id).Str("lora", name).Msg("an adapter of this name was loaded already (an earlier process of this run): replaced")
		err = c.LoadAdapter(ctx, name, dir)
	}
	if err != nil {
		return fmt.Errorf("adapter sync of model %s to %s: %w", ms.id, version, err)
	}
	c.Route(ms.id, name)
	e.adapterServed[ms.id] = name
	if old != "" && old != name {
		if err := c.UnloadAdapter(ctx, old); err != nil {
			log.Warn().Str("model", ms.id).Str("lora", old).Err(err).Msg("could not unload the previous adapter version (it holds the engine's memory until it restarts)")
		}
	}
	e.pruneWeights(ms.id, version)
	log.Debug().Str("model", ms.id).Str("lora", name).Str("dir", dir).Msg("engines serve the adapter's new version")
	return nil
}

// writeFolder writes model id's folder of a version for the engines atomically, with save on the
// torch thread: into a temporary folder, renamed into place when complete. It returns the
// folder's absolute path.
func (e *engineSync) writeFolder(id, version string, save func(dir string) error) (string, error) {
	base, err := filepath.Abs(filepath.Join(e.dir, WeightsDir, id))
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, version)
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil { // a leftover of an interrupted write of ours
		return "", err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := torch.Do(func() error { return save(tmp) }); err != nil {
		return "", fmt.Errorf("model %s: write weights for the engines: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil { // the same version written before a resume
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

var versionDir = regexp.MustCompile(`^v\d+(\.tmp)?$`)

// pruneWeights removes the versions of a model's served weights other than keep (only folders drmas
// names v<N>, nothing else in the folder).
func (e *engineSync) pruneWeights(id, keep string) {
	base := filepath.Join(e.dir, WeightsDir, id)
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != keep && versionDir.MatchString(e.Name()) {
			if err := os.RemoveAll(filepath.Join(base, e.Name())); err != nil {
				log.Warn().Err(err).Str("dir", e.Name()).Msg("could not prune an old weights version")
			}
		}
	}
}

// metrics adds how long weight syncs took since the last call (time/weight_sync) and, per
// engine-served model, how many replicas serve the current weights (rollout/replicas/<model>).
func (e *engineSync) metrics(m Metrics) {
	if len(e.clients) == 0 {
		return
	}
	m["time/weight_sync"] = e.seconds
	e.seconds = 0
	e.managedMetrics(m)
	for id, n := range e.reloadedAhead {
		m[metric.ReloadedAheadModel(id)] = float64(n)
		e.reloadedAhead[id] = 0
	}
	want := "v" + strconv.Itoa(e.synced)
	for id, c := range e.clients {
		n := 0
		for _, v := range c.Versions() {
			// An adapter's replicas serve its base's one version (synced once) and its latest one; a
			// replica that loaded the update's weights ahead of the sync (reloadAhead) serves the newest.
			if v == want || (e.adapterServed[id] != "" && v != "") || (v != "" && v == e.written[id][1]) {
				n++
			}
		}
		m["rollout/replicas/"+id] = float64(n)
	}
}

// sync brings the serving engines (models[].rollout) to the current weights before a rollout:
// rank 0 writes and loads them, the other ranks wait for it, so no rank samples on stale weights.
func (e *engineSync) sync(ctx context.Context, step int, models []*modelState) error {
	if err := e.ready(ctx); err != nil { // a managed replica being restarted comes back first
		return err
	}
	if e.group.Rank() == 0 {
		if err := e.ensure(ctx, step, models); err != nil {
			return err
		}
	}
	if e.group.Size() > 1 && len(e.clients) > 0 {
		if err := e.group.Barrier(); err != nil {
			return err
		}
		if e.group.Rank() != 0 { // rank 0 loaded each adapter's version under its step's name
			for _, ms := range models {
				if c := e.clients[ms.id]; c != nil && ms.cfg.IsAdapter() {
					c.Route(ms.id, e.servedAdapter(ms.id, step))
				}
			}
		}
	}
	return nil
}

// unloadAdapters drops from the engines the adapter versions this run loaded (rank 0 loads them),
// so that a run, finished or failed, leaves no adapter holding an engine's memory or LoRA slots;
// each checkpoint holds the adapters for serving later.
func (e *engineSync) unloadAdapters() {
	if e == nil || len(e.adapterServed) == 0 || e.group.Rank() != 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := make([]string, 0, len(e.adapterServed))
	for id := range e.adapterServed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if c := e.clients[id]; c != nil {
			if err := c.UnloadAdapter(ctx, e.adapterServed[id]); err != nil {
				log.Warn().Str("model", id).Str("lora", e.adapterServed[id]).Err(err).Msg("could not unload the run's last adapter version from the engines")
			}
		}
		delete(e.adapterServed, id)
	}
}

// ReplicasDir is the folder under run.dir of the managed replicas' logs, pid files and starting
// weights (a name pkg/rundir knows as drmas's).
const ReplicasDir = "replicas"

// startManaged starts model id's managed replicas (models[].rollout.engine: managed): drmas serve
// processes on loopback, started from the model's current weights written under <run>/replicas, with
// weight updates from the run folder and a key of their own. It returns the rollout section the
// engine client connects with: SGLang's protocol at the replicas' URLs.
func (e *engineSync) startManaged(ctx context.Context, id string, mc config.ModelConfig, pol *policy.Policy) (engine.Config, error) {
	r := mc.Rollout
	if e.group.Size() > 1 {
		return r, fmt.Errorf("models[%s].rollout.engine: managed replicas run beside one process; with %d ranks, start drmas serve replicas yourself and name them in urls (engine: sglang)",
			id, e.group.Size())
	}
	root, err := filepath.Abs(e.dir)
	if err != nil {
		return r, err
	}
	start := filepath.Join(root, ReplicasDir, id+"-start")
	if err := os.RemoveAll(start); err != nil { // a previous process's, of this run
		return r, err
	}
	if err := torchSave(pol, start); err != nil {
		return r, fmt.Errorf("model %s: the managed replicas' starting weights: %w", id, err)
	}
	devices := r.Devices
	if len(devices) == 0 && mc.Device != "" {
		devices = []string{mc.Device}
	}
	set, err := replica.Start(ctx, replica.Options{Model: id, Folder: start, Root: root, Logs: filepath.Join(root, ReplicasDir),
		Count: r.Replicas, Devices: devices, Threads: r.Threads, CPUs: r.CPUs, DType: mc.DType, Launch: e.launch,
		Current: func() (string, string) { return e.servedOf(id) }})
	if err != nil {
		return r, fmt.Errorf("models[%s].rollout: %w", id, err)
	}
	e.managed[id] = set
	log.Info().Str("model", id).Strs("urls", set.URLs()).Str("logs", filepath.Join(root, ReplicasDir)).Msg("managed drmas serve replicas started")
	// A request in flight when a replica dies is retried while it restarts (the backoff doubles from
	// 0.1 s to 5 s: 8 retries wait about 16 s).
	r.Engine, r.URLs, r.APIKey, r.Retries = engine.SGLang, set.URLs(), set.Key(), max(r.Retries, 8)
	return r, nil
}

// servedOf is the folder and version model id's engines were last synced to ("" before the first).
func (e *engineSync) servedOf(id string) (string, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v := e.served[id]
	return v[0], v[1]
}

// setServed records a sync of model id's engines; the managed replicas' starting folder is no longer
// needed once they serve a synced version.
func (e *engineSync) setServed(id, dir, version string) {
	e.mu.Lock()
	first := e.served[id][0] == ""
	e.served[id] = [2]string{dir, version}
	e.mu.Unlock()
	if _, ok := e.managed[id]; ok && first {
		_ = os.RemoveAll(filepath.Join(e.dir, ReplicasDir, id+"-start"))
	}
}

// ready waits until the managed replicas of the models ids (none: of every model) answer after a
// restart (bounded by each model's rollout timeout).
func (e *engineSync) ready(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		for id := range e.managed {
			ids = append(ids, id)
		}
		sort.Strings(ids)
	}
	for _, id := range ids {
		mc, _ := e.cfg.ModelByID(id)
		c, cancel := context.WithTimeout(ctx, mc.Rollout.Timeout)
		err := e.managed[id].Ready(c)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// managedMetrics adds how many times each model's managed replicas were restarted.
func (e *engineSync) managedMetrics(m Metrics) {
	for id, set := range e.managed {
		m[metric.RestartsModel(id)] = float64(set.Restarts())
	}
}

// close unloads the run's adapters from the engines and stops the managed replicas.
func (e *engineSync) close() {
	if e == nil {
		return
	}
	e.unloadAdapters()
	for _, set := range e.managed {
		set.Close()
	}
}

// torchSave writes pol's model folder on the torch thread.
func torchSave(pol *policy.Policy, dir string) error {
	return torch.Do(func() error { return pol.Save(dir) })
}
