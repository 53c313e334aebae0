package train

import (
	"context"

	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// openEngines opens the fleet of the team's serving engines (models[].rollout; pkg/engine): the
// trained models and the frozen bases that serve their adapters, each with its codec, its local
// policy and how its current weights are written (on the torch thread). An engine that is down stops
// the run before training.
func openEngines(ctx context.Context, team *Team, models []*modelState, run string, g engine.Group, launch engine.Launcher) (*engine.Fleet, error) {
	c := team.Config
	var trained, bases []engine.Model
	for _, mc := range c.Models {
		if c.IsFrozenBase(mc.ID) {
			pol := team.Router[mc.ID]
			bases = append(bases, fleetModel(mc.ID, "", c.WeightsOf(mc), pol, pol.Save))
		}
	}
	for _, ms := range models {
		mc := ms.cfg
		if mc.IsAdapter() {
			trained = append(trained, fleetModel(ms.id, mc.Base, c.WeightsOf(mc), ms.pol, ms.pol.Model.Adapter().Save))
			continue
		}
		trained = append(trained, fleetModel(ms.id, "", mc, ms.pol, ms.pol.Save))
	}
	return engine.Open(ctx, trained, bases, engine.Options{Run: run, Group: g, Launch: launch, Local: team.Router})
}

// fleetModel is what the fleet needs of one model: save writes its current weights on the torch
// thread.
func fleetModel(id, base string, mc model.Config, pol *policy.Policy, save func(dir string) error) engine.Model {
	return engine.Model{ID: id, Base: base, Rollout: mc.Rollout, Device: mc.Device, DType: mc.DType, Local: pol,
		Codec: engine.Codec{Prompt: pol.EncodePromptWith, Tok: pol.Tok, StopIDs: pol.StopIDs, Routes: pol.Model.RouteShape()},
		Save:  func(dir string) error { return torch.Do(func() error { return save(dir) }) }}
}

// fleetGroup is the process group as the engines see it: rank 0 publishes the weights while the
// others wait at the barrier, which first settles (under dist.shard parameters rank 0 writes the
// weights unit by unit, the others taking part in its gathers).
type fleetGroup struct{ par parallel }

func (f fleetGroup) Rank() int { return f.par.group().Rank() }

func (f fleetGroup) Size() int { return f.par.group().Size() }

func (f fleetGroup) Barrier() error {
	if err := torch.Do(f.par.settle); err != nil {
		return err
	}
	return f.par.group().Barrier()
}
