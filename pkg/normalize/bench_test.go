package normalize

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// benchBatch builds 1,000,000 samples: 10,000 prompt groups × 8 trajectories × 12–13 calls, four
// agents called in turn (~25 calls per agent per group), scores a team reward with 1-in-10 malformed
// calls. Every string is its own allocation, as after JSON decoding.
func benchBatch() []Sample {
	r := rand.New(rand.NewPCG(1, 1))
	agents := []string{"verifier", "searcher", "answerer", "solver"}
	out := make([]Sample, 0, 1_000_000)
	for g := range 10_000 {
		for t := range 8 {
			reward := float64(r.IntN(2))
			for c := range 12 + t%2 {
				score := reward
				if r.IntN(10) == 0 {
					score -= 0.01
				}
				out = append(out, Sample{
					UID:     fmt.Sprintf("q%05d", g),
					TrajUID: fmt.Sprintf("q%05d-%d", g, t),
					Agent:   strings.Clone(agents[(c+r.IntN(2))%4]),
					Score:   score,
				})
			}
		}
	}
	return out
}

// BenchmarkCompute reports ns/sample for one million samples; the aim is < 100 on one core.
func BenchmarkCompute(b *testing.B) {
	samples := benchBatch()
	for _, bc := range []struct {
		name string
		opt  Options
	}{
		{"drmas", DrMAS()},
		{"grpo", GRPO()},
		{"drmas-trajectory", with(DrMAS(), func(o *Options) { o.Weighting = Trajectory })},
		{"grpo-call", GRPOCall()},
		{"at-grpo", ATGRPO()},
		{"role-baseline", RoleBaseline()},
		{"drmas-override", with(DrMAS(), func(o *Options) { o.Agents = map[string]Options{"searcher": GRPO()} })},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Compute(samples, bc.opt); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(samples)), "ns/sample")
		})
	}
}

// BenchmarkComputeResolved is the trainer's call: the advantages with the Lemma 4.2 energy ratios, from
// one index (one pass more under drmas, whose own pass is the Dr. MAS reference; two more otherwise).
func BenchmarkComputeResolved(b *testing.B) {
	samples := benchBatch()
	for _, bc := range []struct {
		name string
		opt  Options
	}{{"drmas", DrMAS()}, {"at-grpo", ATGRPO()}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ComputeResolved(samples, bc.opt); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(samples)), "ns/sample")
		})
	}
}
