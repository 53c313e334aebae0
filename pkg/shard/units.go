package shard

import (
	"fmt"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// unitModel is one model whose weights this rank holds as shards (dist.shard: parameters): a
// trained model, a LoRA adapters' frozen base or a KL reference. It is the model's policy.Units:
// each pass over the model is a round of its rank's lockstep (rounds.go), and within it the pass's
// collectives — a gather per unit, under a trained model's backward a reduce-scatter per unit — run
// in the order its script says, the same on every rank, whether the rank computes or only takes
// part. Held whole (Hold, Weights.Whole), a model's passes are this rank's alone: no collective.
type unitModel struct {
	id      string
	m       *policy.Model
	g       *c10d.Group
	r       *rounds
	index   int     // in r.models
	units   []*unit // the layers, then the root
	trained bool    // the shards train: a backward reduces the units' gradients into them
	// hold: Hold keeps the model whole for generation (dist.rollout_gather: model).
	hold bool
	held int       // Hold and Whole calls not yet released: every unit gathered while > 0
	pass *unitPass // the pass in progress
	kept bool      // the root gathered by a training forward, for its backward
}

// unitPass is a pass in progress: its script of collectives and how far it has got.
type unitPass struct {
	kind  policy.Pass
	ops   []unitOp
	next  int
	local bool // the model is held whole: no collective
}

// unitOp is one collective of a pass: unit's gather, or its gradients' reduce-scatter.
type unitOp struct {
	unit   int
	reduce bool
}

// passHold is the round kind of Hold: a forward's gathers, kept (rounds.go).
const passHold = policy.PassBackward + 1

// newUnitModel cuts a whole model's weights into this rank's shards (the model's tensors then hold
// no data) and makes itself the model's Units.
func newUnitModel(id string, m *policy.Model, g *c10d.Group, r *rounds, trained, hold bool) *unitModel {
	um := &unitModel{id: id, m: m, g: g, r: r, trained: trained, hold: hold}
	for _, ps := range m.UnitParams() {
		um.units = append(um.units, cutUnit(ps, g.Size(), g.Rank(), trained))
	}
	r.add(um)
	m.SetUnits(um)
	return um
}

func (um *unitModel) root() int { return len(um.units) - 1 }

// script lists a pass's collectives in order. A forward (and Hold) gathers the root, then each layer;
// a backward gathers each layer from the last and, trained, reduces its gradients before the next,
// then the root's (gathered since the training forward).
func (um *unitModel) script(kind policy.Pass) []unitOp {
	L := um.root()
	if kind != policy.PassBackward {
		ops := []unitOp{{unit: L}}
		for i := 0; i < L; i++ {
			ops = append(ops, unitOp{unit: i})
		}
		return ops
	}
	var ops []unitOp
	for i := L - 1; i >= 0; i-- {
		ops = append(ops, unitOp{unit: i})
		if um.trained {
			ops = append(ops, unitOp{unit: i, reduce: true})
		}
	}
	if um.trained {
		ops = append(ops, unitOp{unit: L, reduce: true})
	}
	return ops
}

// fatal ends the process on a failed collective inside a pass (no error can leave the model's
// forward): a lost peer, which the group's monitor names too.
func (um *unitModel) fatal(err error) {
	if err != nil {
		log.Fatal().Err(err).Str("model", um.id).Msg("dist.shard parameters: a unit's collective failed")
	}
}

// Begin starts a pass: a round of the ranks' lockstep (rounds.go), unless the model is held whole.
func (um *unitModel) Begin(kind policy.Pass) {
	if um.pass != nil {
		um.fatal(fmt.Errorf("pass %d begun inside pass %d", kind, um.pass.kind))
	}
	if um.held > 0 {
		um.pass = &unitPass{kind: kind, local: true}
		return
	}
	if kind != policy.PassBackward && um.kept { // a training forward whose backward never came
		um.units[um.root()].release()
		um.kept = false
	}
	um.pass = &unitPass{kind: kind, ops: um.script(kind)}
	um.fatal(um.r.begin(um.index, kind))
	if kind == policy.PassBackward && um.trained {
		if !um.kept {
			um.fatal(fmt.Errorf("a backward without its training forward"))
		}
		um.units[um.root()].openGrads()
	}
}

// step runs the pass's next collective, which must be op.
func (um *unitModel) step(op unitOp) {
	p := um.pass
	if p == nil || p.next >= len(p.ops) || p.ops[p.next] != op {
		um.fatal(fmt.Errorf("pass out of step: %+v where the script has %+v", op, p))
	}
	p.next++
	u := um.units[op.unit]
	if op.reduce {
		um.fatal(u.reduce(um.g))
		return
	}
	um.fatal(u.gather(um.g))
	if p.kind == policy.PassBackward && um.trained {
		u.openGrads()
	}
}

// Gather makes unit whole (its shards gathered) for the pass.
func (um *unitModel) Gather(unit int) {
	if !um.pass.local {
		um.step(unitOp{unit: unit})
	}
}

// Release lets unit's gathered weights go (its gradients stay until their Reduce).
func (um *unitModel) Release(unit int) {
	if um.held > 0 {
		return
	}
	um.units[unit].release()
}

// Reduce reduce-scatters unit's gradients into the shards as the backward leaves it.
func (um *unitModel) Reduce(unit int) {
	if !um.pass.local && um.trained {
		um.step(unitOp{unit: unit, reduce: true})
	}
}

// End completes the pass: what its script has left runs as this rank's part alone (a backward cut
// short), the round's later requests are served, and the weights still gathered are released but
// for the root of a training forward, kept for its backward.
func (um *unitModel) End() {
	p := um.pass
	um.pass = nil
	if p.local {
		return
	}
	for _, op := range p.ops[p.next:] {
		um.fatal(um.idleOp(op))
	}
	um.fatal(um.r.end())
	for i, u := range um.units {
		if u.flat != nil && !(p.kind == policy.PassTrain && i == um.root()) {
			u.release()
		}
	}
	um.kept = p.kind == policy.PassTrain
}

// idleOp takes part in one collective of a pass this rank computes nothing for.
func (um *unitModel) idleOp(op unitOp) error {
	u := um.units[op.unit]
	if op.reduce {
		return u.reduce(um.g)
	}
	return u.idleGather(um.g)
}

// idle takes part in another rank's pass of the given kind over this model.
func (um *unitModel) idle(kind policy.Pass) error {
	for _, op := range um.script(kind) {
		if err := um.idleOp(op); err != nil {
			return err
		}
	}
	return nil
}

// Whole says whether the model is held whole here (passes gather nothing).
func (um *unitModel) Whole() bool { return um.held > 0 }

// Hold keeps the model whole while generation holds its decoding layout, under
// dist.rollout_gather: model (a round in which this rank gathers every unit and keeps it).
func (um *unitModel) Hold() (release func()) {
	if !um.hold {
		return func() {}
	}
	um.fatal(torch.Do(func() error { return um.pin(false) }))
	return func() { _ = torch.Do(func() error { um.unpin(); return nil }) }
}

// pin holds the model whole (counted): the first call gathers every unit in a round of kind
// passHold, with zero gradient buffers for its weights when withGrads (training while whole).
// Torch thread.
func (um *unitModel) pin(withGrads bool) error {
	um.held++
	if um.held > 1 {
		return nil
	}
	if um.kept {
		um.units[um.root()].release()
		um.kept = false
	}
	if err := um.r.begin(um.index, passHold); err != nil {
		return err
	}
	for _, op := range um.script(policy.PassForward) {
		if err := um.units[op.unit].gather(um.g); err != nil {
			return err
		}
	}
	if err := um.r.end(); err != nil {
		return err
	}
	if withGrads && um.trained {
		for _, u := range um.units {
			u.openGrads()
		}
	}
	return nil
}

// unpin releases one hold; the last lets every unit go (and any gradient buffers). Torch thread.
func (um *unitModel) unpin() {
	if um.held--; um.held > 0 {
		return
	}
	for _, u := range um.units {
		u.closeGrads()
		u.release()
	}
}

// sync makes the held model rank 0's on every rank (broadcast and checked) and cuts this rank's
// shards from it again: after the format warm-up changed it. Torch thread.
func (um *unitModel) sync() error {
	for _, u := range um.units {
		if err := SyncWeights(um.g, u.names, u.params); err != nil {
			return err
		}
		u.cut(um.g.Rank())
	}
	return nil
}

// copyTo makes m (a Shell of the same shape) a frozen sharded copy of this model: its units have
// copies of this rank's shards. Torch thread.
func (um *unitModel) copyTo(id string, m *policy.Model) *unitModel {
	c := &unitModel{id: id, m: m, g: um.g, r: um.r, hold: um.hold}
	for i, ps := range m.UnitParams() {
		u := *um.units[i]
		u.params, u.flat, u.grad = nil, nil, nil
		for _, p := range ps {
			u.params = append(u.params, p.T)
		}
		_ = torch.Untracked(func() error {
			u.shard = um.units[i].shard.MustDetachCopy(false)
			return nil
		})
		c.units = append(c.units, &u)
	}
	um.r.add(c)
	m.SetUnits(c)
	return c
}

var _ policy.Units = (*unitModel)(nil)
