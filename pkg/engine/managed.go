package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/replica"
	"github.com/drmas/drmas/pkg/rundir"
)

// ReplicasDir is the folder under run.dir of the managed replicas' logs, pid files and starting
// weights (a name the run folder knows as drmas's).
var ReplicasDir = rundir.Own("replicas")

// Launcher runs `drmas` for managed replicas (nil: this executable; tests run their binary).
type Launcher = replica.Launcher

// managed are a fleet's managed replicas (engine: managed): drmas serve processes on loopback it
// starts, supervises and stops, by model id, and the folder and version each model's engines were
// last synced to (a restarted replica is reloaded to it; read by the replicas' supervisors).
type managed struct {
	run     string
	launch  Launcher
	sets    map[string]*replica.Set
	rollout map[string]Config // each model's rollout section (ready's timeout)

	mu      sync.Mutex
	current map[string]published
}

func newManaged(run string, launch Launcher) *managed {
	return &managed{run: run, launch: launch, sets: map[string]*replica.Set{}, rollout: map[string]Config{}, current: map[string]published{}}
}

// start starts model m's replicas, from its current weights written under <run>/replicas, with
// weight updates from the run folder and a key of their own. It returns the rollout section the
// engine client connects with: SGLang's protocol at the replicas' URLs.
func (mg *managed) start(ctx context.Context, m Model) (Config, error) {
	r := m.Rollout
	root, err := filepath.Abs(mg.run)
	if err != nil {
		return r, err
	}
	start := filepath.Join(root, ReplicasDir, m.ID+"-start")
	if err := os.RemoveAll(start); err != nil { // a previous process's, of this run
		return r, err
	}
	if err := m.Save(start); err != nil {
		return r, fmt.Errorf("model %s: the managed replicas' starting weights: %w", m.ID, err)
	}
	devices := r.Devices
	if len(devices) == 0 && m.Device != "" {
		devices = []string{m.Device}
	}
	id := m.ID
	set, err := replica.Start(ctx, replica.Options{Model: id, Folder: start, Root: root, Logs: filepath.Join(root, ReplicasDir),
		Count: r.Replicas, Devices: devices, Threads: r.Threads, CPUs: r.CPUs, DType: m.DType, Launch: mg.launch,
		Current: func() (string, string) { return mg.servedOf(id) }})
	if err != nil {
		return r, fmt.Errorf("models[%s].rollout: %w", id, err)
	}
	mg.sets[id], mg.rollout[id] = set, r
	log.Info().Str("model", id).Strs("urls", set.URLs()).Str("logs", filepath.Join(root, ReplicasDir)).Msg("managed drmas serve replicas started")
	// A request in flight when a replica dies is retried while it restarts (the backoff doubles from
	// 0.1 s to 5 s: 8 retries wait about 16 s).
	r.Engine, r.URLs, r.APIKey, r.Retries = SGLang, set.URLs(), set.Key(), max(r.Retries, 8)
	return r, nil
}

// has says whether model id's engine is managed replicas.
func (mg *managed) has(id string) bool { _, ok := mg.sets[id]; return ok }

// servedOf is the folder and version model id's engines were last synced to, as the replicas' wire
// spells it ("" before the first).
func (mg *managed) servedOf(id string) (string, string) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	s := mg.current[id]
	return s.dir, s.v.String()
}

// served records a sync of model id's engines; the managed replicas' starting folder is no longer
// needed once they serve a synced version.
func (mg *managed) served(id, dir string, v llm.Version) {
	mg.mu.Lock()
	first := mg.current[id].dir == ""
	mg.current[id] = published{dir, v}
	mg.mu.Unlock()
	if mg.has(id) && first {
		_ = os.RemoveAll(filepath.Join(mg.run, ReplicasDir, id+"-start"))
	}
}

// ready waits until the managed replicas of the models ids (none: of every model) answer after a
// restart (bounded by each model's rollout timeout).
func (mg *managed) ready(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		for id := range mg.sets {
			ids = append(ids, id)
		}
		sort.Strings(ids)
	}
	for _, id := range ids {
		c, cancel := context.WithTimeout(ctx, mg.rollout[id].Timeout)
		err := mg.sets[id].Ready(c)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// metrics adds how many times each model's managed replicas were restarted.
func (mg *managed) metrics(m map[string]float64) {
	for id, set := range mg.sets {
		m[metric.RestartsModel(id)] = float64(set.Restarts())
	}
}

// close stops the replicas.
func (mg *managed) close() {
	for _, set := range mg.sets {
		set.Close()
	}
}
