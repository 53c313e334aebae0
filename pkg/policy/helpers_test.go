package policy

import (
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/torch"
)

// onTorch runs fn on the torch thread inside a scope that frees everything fn makes.
func onTorch(t testing.TB, fn func() error) {
	t.Helper()
	err := torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		return fn()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// tinyConfig is a small model of each family: GQA, Qwen2 biases, Qwen3 norms and explicit head_dim,
// a Mistral window shorter than most test sequences, Gemma's head_dim (not hidden/heads) and biases.
func tinyConfig(family string, vocab int) arch.Config {
	c := arch.Config{ModelType: family, HiddenSize: 32, IntermediateSize: 64, NumHiddenLayers: 2,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, VocabSize: vocab, MaxPositionEmbeddings: 256}
	switch family {
	case arch.Qwen3:
		c.HeadDim = 16
	case arch.Qwen2:
		c.TieWordEmbeddings = true
	case arch.Mistral:
		c.SetRaw("sliding_window", 5)
	case arch.Gemma:
		c.HeadDim, c.AttentionBias, c.TieWordEmbeddings = 12, true, true
	case arch.Qwen3MoE: // layer 0 dense, layer 1 four experts of which each token takes two
		c.HeadDim = 16
		c.SetRaw("num_experts", 4)
		c.SetRaw("num_experts_per_tok", 2)
		c.SetRaw("moe_intermediate_size", 24)
		c.SetRaw("mlp_only_layers", []int{0})
		c.SetRaw("norm_topk_prob", true)
	}
	c.FillDefaults()
	return c
}

// randomModel builds a tiny random model; scale is the init std (large values give peaked,
// tie-free distributions).
func randomModel(t testing.TB, family string, vocab int, dt gotch.DType, scale float64, seed int64) *Model {
	t.Helper()
	c := tinyConfig(family, vocab)
	c.InitializerRange = scale
	var m *Model
	err := torch.Do(func() error {
		var err error
		m, err = NewRandom(c, gotch.CPU, dt, seed)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// charPolicy wraps m with the toy character-level tokenizer and ChatML.
func charPolicy(t testing.TB, m *Model) *Policy {
	t.Helper()
	tok := tokenizer.NewCharLevel([]string{"<answer>", "</answer>"}, nil)
	chat, err := tokenizer.BuiltinChatTemplate(tokenizer.TemplateChatML, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPolicy("test", m, tok, chat)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func int64s(ids []int) []int64 {
	out := make([]int64, len(ids))
	for i, v := range ids {
		out[i] = int64(v)
	}
	return out
}

// idsTensor is a [1, n] or [B, n] int64 tensor of ids.
func idsTensor(rows ...[]int) *ts.Tensor {
	var flat []int64
	for _, r := range rows {
		flat = append(flat, int64s(r)...)
	}
	return ts.MustOfSlice(flat).MustView([]int64{int64(len(rows)), int64(len(rows[0]))}, true)
}

// values reads a tensor as float64s.
func values(x *ts.Tensor) []float64 { return x.Float64Values() }
