package train

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/replica"
	"github.com/drmas/drmas/pkg/torch"
)

// ReplicasDir is the folder under run.dir of the managed replicas' logs, pid files and starting
// weights (a name pkg/rundir knows as drmas's).
const ReplicasDir = "replicas"

// startManaged starts model id's managed replicas (models[].rollout.engine: managed): drmas serve
// processes on loopback, started from the model's current weights written under <run>/replicas, with
// weight updates from the run folder and a key of their own. It returns the rollout section the
// engine client connects with: SGLang's protocol at the replicas' URLs.
func (e *engineSync) startManaged(ctx context.Context, id string, mc config.ModelConfig, pol *policy.Policy) (config.RolloutConfig, error) {
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
		Count: r.Replicas, Devices: devices, Threads: r.Threads, DType: mc.DType, Launch: e.launch,
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

// ready waits until every managed replica answers after a restart (bounded by its rollout timeout).
func (e *engineSync) ready(ctx context.Context) error {
	ids := make([]string, 0, len(e.managed))
	for id := range e.managed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
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
