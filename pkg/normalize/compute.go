package normalize

import (
	"fmt"
	"math"
)

// Sample is one agent call.
type Sample struct {
	UID     string  `json:"uid"`      // prompt group: the N rollouts of one task
	TrajUID string  `json:"traj_uid"` // trajectory; scoped by UID (equal TrajUIDs under two uids are two trajectories)
	Agent   string  `json:"agent"`
	Score   float64 `json:"score"` // the trajectory's outcome reward minus this call's invalid-action penalty
}

// MaxScore bounds |Score|. With it and Eps ≥ MinEps, |A| ≤ 2·MaxScore/MinEps and every sum and square
// Compute forms stays finite, so any valid input gives finite advantages and finite score and advantage
// statistics (only an inflation factor, a ratio to σ², can overflow, when σ is near the smallest
// float64). Rewards are O(1); a score beyond this bound is a bug upstream.
const MaxScore = 1e50

// Result is the output of Compute.
type Result struct {
	Advantages []float64 // one per sample, aligned with the input
	Stats      Stats
	// EnergyRatios is, per agent, ΣA²(GRPO) / ΣA²(Dr. MAS) on the same samples (see EnergyRatios); only
	// ComputeResolved fills it.
	EnergyRatios map[string]float64
	// Diagnostics are the reference code's per-agent diagnostics of the batch (Diagnose), with the
	// estimator's advantages; only ComputeResolved fills them.
	Diagnostics []AgentDiag
}

// Compute returns the advantage of every sample under opt, with the batch's statistics.
//
// Groups are processed in the order of each uid's first sample and the result does not depend on how
// the samples of different groups are interleaved (up to rounding). An error means invalid options or
// a score that is not finite or exceeds MaxScore; nothing is computed then.
func Compute(samples []Sample, opt Options) (Result, error) {
	if err := opt.Validate(); err != nil {
		return Result{}, fmt.Errorf("normalize: %w", err)
	}
	idx, err := indexOf(samples)
	if err != nil {
		return Result{}, err
	}
	return run(samples, opt, idx, false), nil
}

// ComputeResolved is Compute for options resolved from a spec (Spec.Options), which were checked
// then and are not validated again: a trainer resolves its estimator once and computes under it every
// iteration. It adds the Lemma 4.2 energy ratios (Result.EnergyRatios), from the same grouping of the
// samples: one index, and one pass per estimator (the estimator's, and those of the two references
// it is not); and the reference code's diagnostics (Result.Diagnostics).
func ComputeResolved(samples []Sample, opt Options) (Result, error) {
	idx, err := indexOf(samples)
	if err != nil {
		return Result{}, err
	}
	res := run(samples, opt, idx, false)
	res.EnergyRatios = energyRatios(samples, opt, idx, &res.Stats)
	res.Diagnostics = Diagnose(samples, res.Advantages)
	return res, nil
}

// indexOf groups the samples by uid, checking their number and scores.
func indexOf(samples []Sample) (index, error) {
	if len(samples) > math.MaxInt32 {
		return index{}, fmt.Errorf("normalize: %d samples: at most %d per call", len(samples), math.MaxInt32)
	}
	idx, err := newIndex(samples)
	if err != nil {
		return index{}, fmt.Errorf("normalize: %w", err)
	}
	return idx, nil
}

// run computes the advantages of the indexed samples under valid options; noGroups keeps no
// per-group statistics.
func run(samples []Sample, opt Options, idx index, noGroups bool) Result {
	c := newComputer(samples, opt, idx)
	c.noGroups = noGroups
	for g := range c.idx.uids {
		c.group(g)
	}
	return Result{Advantages: c.adv, Stats: c.finish()}
}

// Stream computes advantages one prompt group at a time, for inputs too large to hold: fed the groups
// in the order of each uid's first sample, each group's samples in input order, it gives the
// advantages and statistics Compute gives for the whole batch, bit for bit. Memory is that of the
// largest group plus the per-group statistics.
type Stream struct {
	c *computer
}

// NewStream starts a stream under opt.
func NewStream(opt Options) (*Stream, error) {
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("normalize: %w", err)
	}
	c := &computer{opt: opt, perAgent: make([]GroupAgentStats, 0, 1024)}
	c.stats = Stats{Options: opt, PerGroup: []GroupStats{}}
	return &Stream{c: c}, nil
}

// Group computes the advantages of one prompt group: samples all share one uid, not seen in an
// earlier call. The result is aligned with samples and valid until the next call.
func (s *Stream) Group(samples []Sample) ([]float64, error) {
	c := s.c
	m := len(samples)
	if m == 0 {
		return nil, nil
	}
	if int64(c.stats.Samples)+int64(m) > math.MaxInt32 {
		return nil, fmt.Errorf("normalize: more than %d samples", math.MaxInt32)
	}
	uid := samples[0].UID
	for i := range samples {
		x := &samples[i]
		if x.UID != uid {
			return nil, fmt.Errorf("normalize: sample %d of group %q has uid %q", i, uid, x.UID)
		}
		if !(math.Abs(x.Score) <= MaxScore) {
			return nil, fmt.Errorf("normalize: uid %q, traj_uid %q, agent %q: score %v: want a finite value within ±%g",
				x.UID, x.TrajUID, x.Agent, x.Score, MaxScore)
		}
	}
	c.grow(m)
	if cap(c.adv) < m {
		c.adv = make([]float64, m)
	}
	c.samples, c.adv = samples, c.adv[:m]
	c.idx = index{uids: []string{uid}, start: []int32{0, int32(m)}}
	c.group(0)
	c.stats.Samples += m
	c.stats.Groups++
	return c.adv, nil
}

// DropGroupStats makes the stream keep no per-group statistics (Stats.PerGroup stays empty): its
// memory is then that of the largest group alone.
func (s *Stream) DropGroupStats() { s.c.noGroups = true }

// Finish returns the statistics of every group fed.
func (s *Stream) Finish() Stats {
	s.c.samples, s.c.idx = nil, index{}
	return s.c.finish()
}
