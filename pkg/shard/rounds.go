package shard

import (
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/policy"
)

// rounds keep the ranks' passes over sharded models (dist.shard: parameters) in lockstep. A unit's
// gather and reduce-scatter are collectives, so every rank must take part in every pass any rank
// makes — but the ranks do different work: each rolls out its own tasks (different calls, lengths
// and numbers of decoding steps), scores and trains on its own share of the calls (different
// numbers of micro-batches), and rank 0 alone validates and writes checkpoints and weights.
//
// So each pass is a round. It opens with one all-reduce of a small vector of requests, one entry per
// (sharded model, pass kind), in which each rank marks the pass it is about to make (a rank that has
// none marks nothing). Every rank then runs the round's requested passes in one fixed order: the
// one it asked for computing (its units gathered and used, its gradients reduced), the others only
// taking part in their collectives (gathering and dropping, reducing zeros). Ranks that asked for
// the same pass run it together. A rank with no pass of its own left — at a collective the step calls
// (pkg/train's strategy methods), after validating, after a checkpoint — settles (Weights.Settle):
// it joins rounds asking for nothing until a round in which no rank asks for anything, when every
// rank is settled.
//
// Every collective outside the rounds must therefore come after a settle on every rank: the
// parameter strategy (pkg/train/fsdp.go) settles inside each of its collectives, and the trainer
// where one rank works alone (record, the checkpointer, the engines' barrier).
type rounds struct {
	g      *c10d.Group
	models []*unitModel // in the order every rank added them
	flags  []float64    // the open round's requests
	mine   int          // this rank's request in it
}

// passKinds are the round's kinds of pass per model: forward, training forward, backward, hold.
const passKinds = int(passHold) + 1

// add registers a sharded model (every rank in the same order).
func (r *rounds) add(um *unitModel) {
	um.index = len(r.models)
	r.models = append(r.models, um)
}

// begin opens a round in which this rank makes pass kind over model k, taking part first in the
// round's passes ordered before it.
func (r *rounds) begin(k int, kind policy.Pass) error {
	flags := make([]float64, len(r.models)*passKinds)
	r.mine = k*passKinds + int(kind)
	flags[r.mine] = 1
	if err := r.g.AllReduceFloats(flags, c10d.Sum); err != nil {
		return err
	}
	r.flags = flags
	return r.serve(0, r.mine)
}

// end closes the round, taking part in its passes ordered after this rank's.
func (r *rounds) end() error {
	err := r.serve(r.mine+1, len(r.flags))
	r.flags = nil
	return err
}

// serve takes part in the requested passes of the open round in [lo, hi).
func (r *rounds) serve(lo, hi int) error {
	for i := lo; i < hi; i++ {
		if r.flags[i] > 0 {
			if err := r.models[i/passKinds].idle(policy.Pass(i % passKinds)); err != nil {
				return err
			}
		}
	}
	return nil
}

// settle takes part in the other ranks' rounds until every rank has settled (a round with no
// request). It returns at once with no sharded model.
func (r *rounds) settle() error {
	if r == nil || len(r.models) == 0 {
		return nil
	}
	for {
		r.flags = make([]float64, len(r.models)*passKinds)
		if err := r.g.AllReduceFloats(r.flags, c10d.Sum); err != nil {
			return err
		}
		any := false
		for _, f := range r.flags {
			any = any || f > 0
		}
		if !any {
			r.flags = nil
			return nil
		}
		if err := r.serve(0, len(r.flags)); err != nil {
			return err
		}
	}
}
