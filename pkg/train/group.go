package train

import (
	"fmt"
	"strconv"
	"time"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch/ts"
	"gopkg.in/yaml.v3"
)

// JoinGroup forms the process group of a launch environment with the config's dist settings. The
// backend "auto" is NCCL when the models run on CUDA, else Gloo. At the rendezvous the ranks compare
// their resolved configs and the drmas version (binary) they run: a difference fails on every rank
// with an error wrapping c10d.ErrMismatch that names the keys.
func JoinGroup(cfg *config.Config, e dist.Env, device, binary string) (*c10d.Group, error) {
	d := cfg.Dist
	backend := d.Backend
	if backend == dist.BackendAuto {
		backend = dist.BackendGloo
		if usesCUDA(cfg, device) {
			backend = dist.BackendNCCL
		}
	}
	id, err := configIdentity(cfg)
	if err != nil {
		return nil, err
	}
	id["drmas.version"] = binary
	return c10d.Init(e, c10d.Options{Backend: backend, Timeout: time.Duration(d.TimeoutS) * time.Second,
		Stall: time.Duration(d.StallS) * time.Second, Identity: id})
}

// configIdentity flattens the resolved config (as --dry-run prints it) into key → value, with the
// keys --set takes (models.0.optim.lr) and the values as YAML writes them.
func configIdentity(cfg *config.Config) (map[string]string, error) {
	b, err := cfg.YAML()
	if err != nil {
		return nil, fmt.Errorf("resolved config: %w", err)
	}
	var tree any
	if err := yaml.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("resolved config: %w", err)
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(joinKey(prefix, k), e)
			}
		case []any:
			for i, e := range x {
				walk(joinKey(prefix, strconv.Itoa(i)), e)
			}
			if len(x) == 0 {
				out[prefix] = "[]"
			}
		default:
			out[prefix] = fmt.Sprint(x)
		}
	}
	walk("", tree)
	return out, nil
}

func joinKey(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// usesCUDA reports whether any model will run on a CUDA device.
func usesCUDA(cfg *config.Config, device string) bool {
	for _, m := range cfg.Models {
		m = cfg.WeightsOf(m)
		d := m.Device
		if d == "" {
			d = device
		}
		if dev, err := torch.ParseDevice(d); err == nil && dev.IsCuda() {
			return true
		}
	}
	return false
}

// RankDevice is the default device of one rank: with CUDA ("auto" finding it, or "cuda"), the GPU of
// its local rank, as torchrun's convention; an explicit cuda:N or cpu stays as it is.
func RankDevice(device string, localRank int) string {
	if device != "" && device != "auto" && device != "cuda" {
		return device
	}
	if d, err := torch.ParseDevice(device); err == nil && d.IsCuda() {
		return fmt.Sprintf("cuda:%d", localRank)
	}
	return device
}

// stopEverywhere makes the stop decision collective: every rank stops at the same iteration when
// any rank wants to (a signal, run.max_minutes).
func stopEverywhere(g *c10d.Group, stop bool) (bool, error) {
	if g.Size() == 1 {
		return stop, nil
	}
	v := []float64{0}
	if stop {
		v[0] = 1
	}
	if err := g.AllReduceFloats(v, c10d.Max); err != nil {
		return false, err
	}
	return v[0] > 0, nil
}

// syncWeights broadcasts every parameter from rank 0 and checks that all ranks then hold the same
// values (weights start identical; a failed check names the tensor).
func syncWeights(g *c10d.Group, names []string, params []*ts.Tensor) error {
	if g.Size() == 1 {
		return nil
	}
	return torch.NoGrad(func() error {
		if err := g.Broadcast(params, 0); err != nil {
			return err
		}
		return g.Verify(names, params)
	})
}

// syncModels broadcasts every model's weights from rank 0 and verifies them (torch thread).
//
// The frozen bases of LoRA adapters too: the warm-up trains them on every rank.
func syncModels(g *c10d.Group, team *Team, models []*modelState) error {
	for _, mc := range team.Config.Models {
		if !team.Config.IsFrozenBase(mc.ID) {
			continue
		}
		names, params := policy.SplitParams(team.Router[mc.ID].Model.Parameters())
		if err := syncWeights(g, names, params); err != nil {
			return fmt.Errorf("model %s (frozen base): %w", mc.ID, err)
		}
	}
	for _, ms := range models {
		if err := syncWeights(g, ms.names, ms.params); err != nil {
			return fmt.Errorf("model %s: %w", ms.id, err)
		}
	}
	return nil
}
