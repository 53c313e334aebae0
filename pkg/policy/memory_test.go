package policy

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// 500 iterations of generate + a training step (Score with grad, backward, SGD) keep the resident
// memory within 10% of its value after iteration 50. It takes one to two minutes on two cores, so it
// runs only with DRMAS_LONG_TESTS=1:
//
//	DRMAS_LONG_TESTS=1 go test ./pkg/policy -run TestMemoryFlat -v
func TestMemoryFlat(t *testing.T) {
	if os.Getenv("DRMAS_LONG_TESTS") == "" {
		t.Skip("set DRMAS_LONG_TESTS=1 to run (one to two minutes)")
	}
	c := tinyConfig(arch.Qwen2, 300)
	c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim = 128, 512, 4, 2, 32
	var m *Model
	onTorch(t, func() error {
		var err error
		m, err = NewRandom(c, gotch.CPU, gotch.Float, 1)
		return err
	})
	p := charPolicy(t, m)
	msgs := func(i int) []llm.Message {
		return []llm.Message{{Role: "user", Content: strings.Repeat("ab", 1+i%7) + strconv.Itoa(i)}}
	}
	iters, batch := 500, 8
	if n, err := strconv.Atoi(os.Getenv("DRMAS_MEM_ITERS")); err == nil && n > 50 {
		iters = n
	}
	var at50, last int64
	start := time.Now()
	for it := 1; it <= iters; it++ {
		reqs := make([]llm.Request, batch)
		for i := range reqs {
			reqs[i] = llm.Request{Agent: "a", Model: "m", Messages: msgs(it + i),
				Sampling: llm.Sampling{Temperature: 1, TopP: 0.9, MaxNewTokens: 6 + i%8, Seed: int64(it*batch + i)}}
		}
		comps, err := p.Generate(context.Background(), reqs)
		if err != nil {
			t.Fatal(err)
		}
		seqs := make([]Sequence, len(comps))
		for i, c := range comps {
			seqs[i] = Sequence{PromptIDs: c.PromptIDs, ResponseIDs: c.ResponseIDs}
		}
		onTorch(t, func() error { return trainStep(m, seqs, 1e-3) })
		torch.ReleaseMemory()
		last = rss(t)
		if it == 50 {
			at50 = last
		}
		if it%(iters/5) == 0 {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			t.Logf("iteration %d: resident memory %.1f MB (Go heap in use %.1f MB, Go total %.1f MB)",
				it, float64(last)/(1<<20), float64(ms.HeapInuse)/(1<<20), float64(ms.Sys)/(1<<20))
		}
	}
	t.Logf("resident memory: %.1f MB after iteration 50, %.1f MB after %d (%+.1f%%); %.1f ms per iteration",
		float64(at50)/(1<<20), float64(last)/(1<<20), iters, 100*(float64(last)/float64(at50)-1),
		time.Since(start).Seconds()*1000/float64(iters))
	if float64(last) > 1.10*float64(at50) {
		t.Fatalf("resident memory grew by more than 10%%: %d KB → %d KB", at50>>10, last>>10)
	}
}

// trainStep is a token-mean policy-gradient-like step with plain SGD: loss = −mean log p, through
// the training path (TrainScore, with checkpointing).
func trainStep(m *Model, seqs []Sequence, lr float64) error {
	sc, bp, err := m.TrainScore(seqs, true, true)
	if err != nil {
		return err
	}
	loss := sc.LogProbs.MustSum(gotch.Invalid, false).MustDiv(sc.Mask.MustSum(gotch.Invalid, false), true).MustNeg(true)
	bp.Backward(loss)
	return torch.NoGrad(func() error {
		for _, p := range m.Parameters() {
			g := p.T.MustGrad(false)
			if !g.MustDefined() {
				return fmt.Errorf("%s has no gradient", p.Name)
			}
			p.T.MustSub_(g.MustMulScalar(ts.FloatScalar(lr), false))
			g.MustZero_()
		}
		return nil
	})
}

func rss(t *testing.T) int64 {
	n := torch.ResidentBytes()
	if n == 0 {
		t.Skip("no /proc/self/statm")
	}
	return n
}
