package policy

import (
	"math/rand/v2"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// sampler draws the next token of every row of a batch on the model's device, each row under its
// own settings: temperature (0 = greedy), top-k and top-p, as in transformers and vLLM
// (temperature, then top-k, then top-p on the renormalised top-k distribution). The randomness is
// one uniform number per row and step, drawn in Go from a PCG stream seeded with the row's
// Sampling.Seed, and turned into a token by inverse-CDF on the row's filtered distribution: a row's
// tokens depend on its seed and its logits only, never on the other rows of the batch.
// Only the chosen ids and their log-probs come back to the host.
type sampler struct {
	vocab     int64
	anySample bool       // some row samples (temperature > 0)
	anyFilter bool       // some sampling row uses top-k or top-p
	temp      *ts.Tensor // [B, 1] compute dtype; 1 for greedy rows
	greedy    *ts.Tensor // [B] bool
	topK      *ts.Tensor // [B, 1] int64; vocab when off
	topP      *ts.Tensor // [B, 1] compute dtype; 2 when off
	rank      *ts.Tensor // [1, vocab] int64: 0…vocab−1
	uniform   *ts.Tensor // [B, steps] float64; nil when steps is 0 (the caller hands the numbers to sampleAt)
	topN      int64      // alternatives returned per token (the most any row asks for; 0 = none)
}

// newSampler builds the per-row tensors of a batch (in the current scope).
func newSampler(settings []llm.Sampling, steps int, vocab int64, dt gotch.DType, dev gotch.Device) *sampler {
	B := int64(len(settings))
	s := &sampler{vocab: vocab}
	temp := make([]float64, B)
	greedy := make([]bool, B)
	topK := make([]int64, B)
	topP := make([]float64, B)
	u := make([]float64, int(B)*steps)
	for i, st := range settings {
		temp[i], topK[i], topP[i] = 1, vocab, 2
		if st.Temperature <= 0 {
			greedy[i] = true
		} else {
			s.anySample = true
			temp[i] = st.Temperature
			if st.TopK > 0 && int64(st.TopK) < vocab {
				topK[i] = int64(st.TopK)
				s.anyFilter = true
			}
			if st.TopP > 0 && st.TopP < 1 {
				topP[i] = st.TopP
				s.anyFilter = true
			}
		}
		rng := rowStream(st.Seed)
		for j := 0; j < steps; j++ {
			u[i*steps+j] = rng.Float64()
		}
	}
	s.temp = ts.MustOfSlice(temp).MustTotype(dt, true).MustTo(dev, true).MustView([]int64{B, 1}, true)
	s.greedy = ts.MustOfSlice(greedy).MustTo(dev, true)
	s.topK = ts.MustOfSlice(topK).MustTo(dev, true).MustView([]int64{B, 1}, true)
	s.topP = ts.MustOfSlice(topP).MustTotype(dt, true).MustTo(dev, true).MustView([]int64{B, 1}, true)
	s.rank = ts.MustArange(ts.IntScalar(vocab), gotch.Int64, dev).MustView([]int64{1, vocab}, true)
	if steps > 0 {
		s.uniform = ts.MustOfSlice(u).MustTo(dev, true).MustView([]int64{B, int64(steps)}, true)
	}
	return s
}

// rowStream is the stream of uniform numbers of a row seeded with seed: its j-th number draws the
// row's token j (newSampler's uniform holds the same numbers).
func rowStream(seed int64) *rand.Rand { return rand.New(rand.NewPCG(uint64(seed), 0x5eed_d2a5)) }

// free releases the sampler's tensors now.
func (s *sampler) free() {
	for _, t := range []*ts.Tensor{s.temp, s.greedy, s.topK, s.topP, s.rank, s.uniform} {
		if t != nil {
			t.MustDrop()
		}
	}
}

// selectRows keeps the rows idx of every per-row tensor (in the current scope).
func (s *sampler) selectRows(idx *ts.Tensor) {
	for _, t := range []**ts.Tensor{&s.temp, &s.greedy, &s.topK, &s.topP, &s.uniform} {
		if *t != nil {
			*t = replace(*t, (*t).MustIndexSelect(0, idx, false))
		}
	}
}

// sample returns the tokens [B] (int64) chosen from logits [B, V] at step, and their log-probs [B]
// under log-softmax(logits / T) (T = 1 for greedy rows), unfiltered; with topN > 0 also the topN
// most likely tokens of every row under the same distribution, [B, topN] log-probs and ids (else nil).
func (s *sampler) sample(logits *ts.Tensor, step int64) (tok, logp, topLogp, topIDs *ts.Tensor) {
	var u *ts.Tensor
	if s.anySample {
		u = s.uniform.MustNarrow(1, step, 1, false)
	}
	return s.sampleAt(logits, u)
}

// sampleAt is sample with each row's uniform number given, u [B, 1] float64 (nil when no row samples).
func (s *sampler) sampleAt(logits, u *ts.Tensor) (tok, logp, topLogp, topIDs *ts.Tensor) {
	greedyTok := logits.MustArgmax([]int64{-1}, false, false)
	var all *ts.Tensor
	if !s.anySample {
		all = logits.MustLogSoftmax(-1, gotch.Invalid, false)
		tok = greedyTok
	} else {
		all = logits.MustDiv(s.temp, false).MustLogSoftmax(-1, gotch.Invalid, true)
		probs := all.MustExp(false)
		if s.anyFilter {
			// Filter in sorted order, then put the kept probabilities back in vocabulary order:
			// the inverse CDF always runs in vocabulary order, so a row draws the same token for
			// the same number whether or not other rows of the batch filter.
			sorted, order := probs.MustSort(-1, true, false)
			keep := s.rank.MustLtTensor(s.topK, false)
			sorted = sorted.MustMul(keep, true)
			total := sorted.MustSumDimIntlist([]int64{-1}, true, gotch.Invalid, false)
			excl := sorted.MustCumsum(-1, gotch.Invalid, false).MustSub(sorted, true).MustDiv(total, true)
			keep = replace(keep, excl.MustLtTensor(s.topP, true))
			sorted = sorted.MustMul(keep, true)
			probs = probs.MustZerosLike(true).MustScatter(-1, order, sorted, true)
		}
		drawn := inverseCDF(probs, u)
		tok = greedyTok.MustWhereSelf(s.greedy, drawn, true)
	}
	if s.topN > 0 {
		topLogp, topIDs = all.MustTopk(min(s.topN, s.vocab), -1, true, true, false)
	}
	logp = all.MustGather(-1, tok.MustUnsqueeze(-1, false), false, true).MustSqueezeDim(-1, true)
	return tok, logp, topLogp, topIDs
}

// inverseCDF returns, for each row of p [B, V] (non-negative, not necessarily normalised), the
// index at which the running sum first exceeds u·sum (u [B, 1] in [0, 1)), never past the last
// non-zero entry.
func inverseCDF(p, u *ts.Tensor) *ts.Tensor {
	V := p.MustSize()[1]
	c := p.MustCumsum(-1, gotch.Double, false)
	total := c.MustNarrow(1, V-1, 1, false)
	thr := u.MustMul(total, false)
	idx := c.MustLeTensor(thr, false).MustSumDimIntlist([]int64{-1}, false, gotch.Int64, true)
	last := c.MustLtTensor(total, false).MustSumDimIntlist([]int64{-1}, false, gotch.Int64, true)
	return idx.MustMinimum(last, true)
}
