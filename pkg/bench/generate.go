package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
)

// benchGenerate times generation from prompts: one call for ResponseLen tokens (after a warm-up
// call), with its decoding steps timed where they run. It enters torch.Do itself.
func benchGenerate(m *policy.Model, prompts [][]int, o Options, r *Result) error {
	p := &policy.Policy{ID: "bench", Model: m, Device: m.Device(), MaxBatch: o.GenBatch, StaticBatching: o.StaticGen}
	if o.GenPrompts > 0 {
		prompts = randomPrompts(o.GenPrompts, o.PromptLen, m.Config.VocabSize, o.Seed)
	}
	lengths := o.GenLengths
	if lengths == nil {
		lengths = make([]int, len(prompts))
		for i := range lengths {
			lengths[i] = o.responseLen(i)
		}
	}
	if len(lengths) != len(prompts) {
		return fmt.Errorf("bench: %d response lengths for %d prompts", len(lengths), len(prompts))
	}
	gen := func(n int) (float64, error) {
		settings := make([]llm.Sampling, len(prompts))
		for i := range settings {
			settings[i] = llm.Sampling{Temperature: 1, MaxNewTokens: min(n, lengths[i]), Seed: int64(i)}
		}
		start := time.Now()
		_, err := p.GenerateIDs(context.Background(), prompts, settings)
		return time.Since(start).Seconds(), err
	}
	if _, err := gen(2); err != nil { // warm-up
		return err
	}
	var stop func()
	if o.Profile != nil {
		stop = o.Profile()
	}
	decoding := p.TimeDecoding() // the decoding steps, timed where they run (prefill and packing excluded)
	cpu0 := cpuSeconds()
	total, err := gen(math.MaxInt)
	r.GenCPUSeconds = cpuSeconds() - cpu0
	if stop != nil {
		stop()
	}
	if err != nil {
		return err
	}
	r.GenPrompts, r.GenBatch, r.GenContinuous = len(prompts), o.GenBatch, !o.StaticGen
	var flops float64
	for i, n := range lengths {
		r.GenTokens += n
		P := len(prompts[i])
		flops += forwardFLOPs(m.Config, 1, P, 0, 1)
		for s := 1; s < n; s++ {
			flops += forwardFLOPs(m.Config, 1, 1, P+s-1, 1)
		}
	}
	r.GenSeconds = total
	r.GenTokensPerSec = float64(r.GenTokens) / total
	if steps, elapsed := decoding(); steps > 0 {
		r.DecodeMsPerStep = elapsed.Seconds() * 1000 / float64(steps)
		r.DecodeSteps = steps
	}
	r.GenGFLOPS = flops / total / 1e9
	return nil
}

// randomPrompts returns n prompts of length tokens drawn with seed.
func randomPrompts(n, length, vocab int, seed int64) [][]int {
	rng := rand.New(rand.NewPCG(uint64(seed), 11))
	out := make([][]int, n)
	for i := range out {
		for range length {
			out[i] = append(out[i], rng.IntN(vocab))
		}
	}
	return out
}
