package bench

import (
	"context"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// go test ./pkg/bench -run '^$' -bench . -benchtime 3x
// (`drmas bench` reports the same figures with FLOP rates and a matmul calibration.)

func benchModel(b *testing.B) *policy.Model {
	c, err := Preset("tiny")
	if err != nil {
		b.Fatal(err)
	}
	var m *policy.Model
	err = torch.Do(func() error {
		var err error
		m, err = policy.NewRandom(c, gotch.CPU, gotch.Float, 1)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkGenerate: 16 prompts of 64 tokens, 32 new tokens each (tiny preset).
func BenchmarkGenerate(b *testing.B) {
	m := benchModel(b)
	p := &policy.Policy{ID: "bench", Model: m, Device: gotch.CPU}
	prompts := make([][]int, 16)
	settings := make([]llm.Sampling, 16)
	for i := range prompts {
		prompts[i] = make([]int, 64)
		for j := range prompts[i] {
			prompts[i][j] = (i*7 + j*13) % 512
		}
		settings[i] = llm.Sampling{Temperature: 1, TopP: 0.95, MaxNewTokens: 32, Seed: int64(i)}
	}
	b.ResetTimer()
	for range b.N {
		if _, err := p.GenerateIDs(context.Background(), prompts, settings); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(16*32*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkTrainStep: Score with grad, token-mean loss, backward and SGD on 16×(64+64) tokens.
func BenchmarkTrainStep(b *testing.B) {
	m := benchModel(b)
	seqs := make([]policy.Sequence, 16)
	for i := range seqs {
		for j := range 64 {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, (i*7+j*13)%512)
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, (i*11+j*5)%512)
		}
	}
	err := torch.Do(func() error {
		b.ResetTimer()
		for range b.N {
			s := torch.NewScope()
			err := sgdStep(m, seqs, 1e-4)
			s.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// sgdStep is one training step with plain SGD: TrainScore with gradient checkpointing, token-mean
// loss of the response log-probs, backward, p −= lr·grad. Torch thread.
func sgdStep(m *policy.Model, seqs []policy.Sequence, lr float64) error {
	sc, bp, err := m.TrainScore(seqs, true, true)
	if err != nil {
		return err
	}
	loss := sc.LogProbs.MustSum(gotch.Invalid, false).MustDiv(sc.Mask.MustSum(gotch.Invalid, false), true).MustNeg(true)
	bp.Backward(loss)
	return torch.NoGrad(func() error {
		for _, p := range m.Parameters() {
			g := p.T.MustGrad(false)
			p.T.MustSub_(g.MustMulScalar(ts.FloatScalar(lr), false))
			g.MustZero_()
		}
		return nil
	})
}
