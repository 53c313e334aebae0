package policy

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/torch"
)

// greedyRecompute decodes greedily by running the whole sequence through the model at every step
// (no cache, no padding): the reference for KV-cache generation.
func greedyRecompute(t *testing.T, m *Model, prompt []int, n int) []int {
	seq := slices.Clone(prompt)
	onTorch(t, func() error {
		for range n {
			s := torch.NewScope()
			logits := m.Forward(idsTensor(seq), nil, nil, nil)
			last := logits.MustSelect(1, int64(len(seq)-1), false).MustArgmax([]int64{-1}, false, true)
			seq = append(seq, int(last.Int64Values()[0]))
			s.Close()
		}
		return nil
	})
	return seq[len(prompt):]
}

func greedy(n int) llm.Sampling { return llm.Sampling{MaxNewTokens: n} }

var prompts = [][]int{
	{260, 10, 72, 101, 108, 108, 111},
	{260, 33},
	{260, 10, 50, 43, 50, 61, 63, 10, 261, 10},
	{72, 105},
	{260, 10, 87, 104, 97, 116, 32, 105, 115},
}

// With the KV cache, temperature 0 gives exactly the tokens of greedy decoding by full recompute,
// for every row of a left-padded batch; and each row matches that row generated alone. Rows stop at
// different lengths, so the batch also shrinks as they finish.
func TestGreedyCacheMatchesRecompute(t *testing.T) {
	for _, family := range arch.ModelTypes() {
		t.Run(family, func(t *testing.T) {
			m := randomModel(t, family, 300, gotch.Double, 0.3, 7)
			p := charPolicy(t, m)
			p.StopIDs = nil // run every row to its own length
			lengths := []int{12, 3, 9, 2, 12}
			settings := make([]llm.Sampling, len(prompts))
			for i := range settings {
				settings[i] = greedy(lengths[i])
			}
			batch, err := p.GenerateIDs(context.Background(), prompts, settings)
			if err != nil {
				t.Fatal(err)
			}
			distinct := map[int]bool{}
			for i, pr := range prompts {
				want := greedyRecompute(t, m, pr, lengths[i])
				if !slices.Equal(batch[i].ResponseIDs, want) {
					t.Fatalf("row %d: cached batch %v, full recompute %v", i, batch[i].ResponseIDs, want)
				}
				alone, err := p.GenerateIDs(context.Background(), [][]int{pr}, settings[i:i+1])
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(alone[0].ResponseIDs, want) {
					t.Fatalf("row %d: alone %v, in a batch %v", i, alone[0].ResponseIDs, want)
				}
				if batch[i].Finish != llm.FinishLength || !slices.Equal(batch[i].PromptIDs, pr) {
					t.Fatalf("row %d: finish %q, prompt %v", i, batch[i].Finish, batch[i].PromptIDs)
				}
				for _, id := range want {
					distinct[id] = true
				}
			}
			if len(distinct) < 4 {
				t.Fatalf("the model emits only %d distinct tokens: the test is too weak", len(distinct))
			}
		})
	}
}

// A sampled row depends on its seed only, not on the rest of the batch; different seeds differ;
// the returned log-probs are log-softmax(logits/T) at the chosen tokens.
func TestSamplingIsPerRowDeterministic(t *testing.T) {
	m := randomModel(t, arch.Qwen2, 300, gotch.Double, 0.1, 3)
	p := charPolicy(t, m)
	p.StopIDs = nil
	settings := []llm.Sampling{
		{Temperature: 1, MaxNewTokens: 10, Seed: 11},
		{Temperature: 0.7, TopK: 20, MaxNewTokens: 10, Seed: 12},
		{Temperature: 1.3, TopP: 0.9, MaxNewTokens: 6, Seed: 13},
		{MaxNewTokens: 10, Seed: 14},
		{Temperature: 1, TopK: 50, TopP: 0.8, MaxNewTokens: 10, Seed: 15},
	}
	batch, err := p.GenerateIDs(context.Background(), prompts, settings)
	if err != nil {
		t.Fatal(err)
	}
	for i := range prompts {
		alone, err := p.GenerateIDs(context.Background(), prompts[i:i+1], settings[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(alone[0].ResponseIDs, batch[i].ResponseIDs) {
			t.Fatalf("row %d: alone %v, in a batch %v", i, alone[0].ResponseIDs, batch[i].ResponseIDs)
		}
	}
	reseeded := slices.Clone(settings[:1])
	reseeded[0].Seed = 99
	other, err := p.GenerateIDs(context.Background(), prompts[:1], reseeded)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(other[0].ResponseIDs, batch[0].ResponseIDs) {
		t.Fatalf("seeds 11 and 99 sampled the same %v", other[0].ResponseIDs)
	}
	// Log-probs: recompute log-softmax(logits / T) along row 1's sequence.
	row := batch[1]
	seq := append(slices.Clone(row.PromptIDs), row.ResponseIDs...)
	onTorch(t, func() error {
		lp := values(m.Forward(idsTensor(seq), nil, nil, nil).MustDivScalar(ts.FloatScalar(0.7), true).MustLogSoftmax(-1, gotch.Invalid, true))
		V := m.Config.VocabSize
		for j, id := range row.ResponseIDs {
			want := lp[(len(row.PromptIDs)-1+j)*V+id]
			if math.Abs(float64(row.LogProbs[j])-want) > 1e-5 {
				return fmt.Errorf("token %d: log-prob %.6f, want %.6f", j, row.LogProbs[j], want)
			}
		}
		return nil
	})
}

// top_k = 1 and a tiny top_p both reduce sampling to greedy decoding.
func TestNarrowFiltersAreGreedy(t *testing.T) {
	m := randomModel(t, arch.Llama, 300, gotch.Double, 0.1, 5)
	p := charPolicy(t, m)
	p.StopIDs = nil
	want, err := p.GenerateIDs(context.Background(), prompts[:2], []llm.Sampling{greedy(8), greedy(8)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.GenerateIDs(context.Background(), prompts[:2], []llm.Sampling{
		{Temperature: 2, TopK: 1, MaxNewTokens: 8, Seed: 1}, {Temperature: 2, TopP: 1e-9, MaxNewTokens: 8, Seed: 2}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if !slices.Equal(got[i].ResponseIDs, want[i].ResponseIDs) {
			t.Fatalf("row %d: filtered sampling %v, greedy %v", i, got[i].ResponseIDs, want[i].ResponseIDs)
		}
	}
}

// The sampler draws from softmax(logits/T) restricted by top-k and top-p (renormalised).
func TestSamplerDistribution(t *testing.T) {
	probs := []float64{0.5, 0.3, 0.15, 0.05}
	for _, tc := range []struct {
		name string
		s    llm.Sampling
		want []float64
	}{
		{"plain", llm.Sampling{Temperature: 1}, probs},
		{"top-k 2", llm.Sampling{Temperature: 1, TopK: 2}, []float64{0.625, 0.375, 0, 0}},
		{"top-p 0.7", llm.Sampling{Temperature: 1, TopP: 0.7}, []float64{0.625, 0.375, 0, 0}},
		{"top-p 0.85", llm.Sampling{Temperature: 1, TopP: 0.85}, []float64{0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
		{"T 0.5", llm.Sampling{Temperature: 0.5}, []float64{0.25 / 0.3625, 0.09 / 0.3625, 0.0225 / 0.3625, 0.0025 / 0.3625}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 4000
			settings := make([]llm.Sampling, n)
			logits := make([]float64, 0, 4*n)
			for i := range settings {
				settings[i] = tc.s
				settings[i].Seed = int64(i)
				for _, p := range probs {
					logits = append(logits, math.Log(p))
				}
			}
			count := make([]float64, 4)
			onTorch(t, func() error {
				smp := newSampler(settings, 1, 4, gotch.Float, gotch.CPU)
				l := ts.MustOfSlice(logits).MustTotype(gotch.Float, true).MustView([]int64{n, 4}, true)
				tok, _, _, _ := smp.sample(l, 0)
				for _, id := range tok.Int64Values() {
					count[id]++
				}
				return nil
			})
			for v, want := range tc.want {
				got := count[v] / n
				sd := math.Sqrt(want*(1-want)/n) + 1e-9
				if math.Abs(got-want) > 4*sd+1e-12 {
					t.Fatalf("token %d drawn with frequency %.4f, want %.4f (±%.4f)", v, got, want, 4*sd)
				}
			}
		})
	}
}

// Stop tokens end a row and stay in ResponseIDs but not in Text; stop strings end it too and stay
// in both; otherwise max_new_tokens ends it.
func TestStops(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 300, gotch.Double, 0.3, 3)
	p := charPolicy(t, m)
	p.StopIDs = nil
	free, err := p.GenerateIDs(context.Background(), prompts[:1], []llm.Sampling{greedy(10)})
	if err != nil {
		t.Fatal(err)
	}
	ref := free[0].ResponseIDs
	// Stop at the 4th token's id (its first occurrence).
	stopID := ref[3]
	at := slices.Index(ref, stopID)
	p.StopIDs = []int{stopID}
	got, err := p.GenerateIDs(context.Background(), prompts[:1], []llm.Sampling{greedy(10)})
	if err != nil {
		t.Fatal(err)
	}
	c := got[0]
	if !slices.Equal(c.ResponseIDs, ref[:at+1]) || c.Finish != llm.FinishStop || c.Text != p.Tok.Decode(ref[:at]) {
		t.Fatalf("stop id %d: got %v %q (%s), want %v %q (stop)", stopID, c.ResponseIDs, c.Text, c.Finish, ref[:at+1], p.Tok.Decode(ref[:at]))
	}
	if len(c.LogProbs) != len(c.ResponseIDs) {
		t.Fatalf("%d log-probs for %d tokens", len(c.LogProbs), len(c.ResponseIDs))
	}
	// A stop string made of two printable tokens of the free run.
	p.StopIDs = nil
	printable := func(id int) bool { return id >= 32 && id < 127 }
	k := -1
	for j := 0; j+1 < len(ref); j++ {
		if printable(ref[j]) && printable(ref[j+1]) {
			k = j
			break
		}
	}
	if k < 0 {
		t.Fatalf("no two printable tokens in a row in %v: pick another seed", ref)
	}
	stop := p.Tok.Decode(ref[k : k+2])
	s := greedy(10)
	s.Stop = []string{"never-there", stop}
	got, err = p.GenerateIDs(context.Background(), prompts[:1], []llm.Sampling{s})
	if err != nil {
		t.Fatal(err)
	}
	c = got[0]
	if c.Finish != llm.FinishStop || len(c.ResponseIDs) > k+2 || !hasSuffix(c.Text, stop) {
		t.Fatalf("stop string %q: got %v %q (%s)", stop, c.ResponseIDs, c.Text, c.Finish)
	}
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// Generate renders the chat template and returns the prompt ids it used; Router dispatches by model.
func TestGenerateChatAndRouter(t *testing.T) {
	a := charPolicy(t, randomModel(t, arch.Qwen2, 300, gotch.Float, 0.1, 1))
	b := charPolicy(t, randomModel(t, arch.Llama, 300, gotch.Float, 0.1, 2))
	msgs := []llm.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "2+2?"}}
	reqs := []llm.Request{
		{Agent: "solver", Model: "a", Messages: msgs, Sampling: llm.Sampling{Temperature: 1, MaxNewTokens: 5, Seed: 1}},
		{Agent: "verifier", Model: "b", Messages: msgs, Sampling: greedy(4)},
		{Agent: "solver", Model: "a", Messages: msgs[1:], Sampling: greedy(3)},
	}
	got, err := Router{"a": a, "b": b}.Generate(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	text, _ := a.Chat.Render([]tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "2+2?"}}, true)
	if !slices.Equal(got[0].PromptIDs, a.Tok.Encode(text)) || !hasSuffix(text, "<|im_start|>assistant\n") {
		t.Fatalf("prompt ids %v are not the rendered chat %q", got[0].PromptIDs, text)
	}
	direct, err := b.Generate(context.Background(), reqs[1:2])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got[1].ResponseIDs, direct[0].ResponseIDs) {
		t.Fatalf("router gave model b's request %v, b itself %v", got[1].ResponseIDs, direct[0].ResponseIDs)
	}
	if len(got[2].ResponseIDs) == 0 || len(got[2].ResponseIDs) > 3 {
		t.Fatalf("request 2: %d tokens for max_new_tokens 3", len(got[2].ResponseIDs))
	}
	if _, err := (Router{"a": a}).Generate(context.Background(), reqs); err == nil || !contains(err.Error(), `"b"`) {
		t.Fatalf("unknown model: err = %v, want one naming \"b\"", err)
	}
	bad := reqs[:1:1]
	bad[0].Sampling.MaxNewTokens = 0
	if _, err := a.Generate(context.Background(), bad); err == nil || !contains(err.Error(), "max_new_tokens") {
		t.Fatalf("max_new_tokens 0: err = %v", err)
	}
}

// A request's chat-template arguments and messages' reasoning_content reach the model's template: the
// prompt ids are those of the render with them.
func TestGenerateChatTemplateKwargs(t *testing.T) {
	p := charPolicy(t, randomModel(t, arch.Qwen2, 300, gotch.Float, 0.1, 3))
	chat, err := tokenizer.NewJinjaChatTemplate("{% for m in messages %}{{ m.role }}:"+
		"{% if m.reasoning_content is string %}({{ m.reasoning_content }}){% endif %}{{ m.content }};{% endfor %}"+
		"{% if enable_thinking is defined and enable_thinking is false %}T{% endif %}{{ date_string }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	p.Chat = chat
	msgs := []llm.Message{{Role: "user", Content: "2+2?"}, {Role: "assistant", Content: "4", ReasoningContent: "ab"},
		{Role: "user", Content: "3?"}}
	reqs := []llm.Request{
		{Agent: "a", Model: "test", Messages: msgs, Sampling: greedy(2)},
		{Agent: "b", Model: "test", Messages: msgs, Sampling: greedy(2),
			ChatTemplateKwargs: map[string]any{"enable_thinking": false, "date_string": "3 Dec"}},
	}
	got, err := p.Generate(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"user:2+2?;assistant:(ab)4;user:3?;", "user:2+2?;assistant:(ab)4;user:3?;T3 Dec"} {
		if ids := p.Tok.Encode(want); !slices.Equal(got[i].PromptIDs, ids) {
			t.Errorf("request %d: prompt ids %v, want those of %q (%v)", i, got[i].PromptIDs, want, ids)
		}
	}
}

// A held decoding layout gives the tokens of the per-batch one and is kept across batches and calls;
// after the weights change in place and it is dropped, the next call packs the new weights; release
// frees it.
func TestHeldDecodingLayout(t *testing.T) {
	m := randomModel(t, arch.Qwen2, 300, gotch.Double, 0.3, 5)
	p := charPolicy(t, m)
	p.StopIDs = nil
	p.MaxBatch = 2 // three batches per call
	settings := make([]llm.Sampling, len(prompts))
	for i := range settings {
		settings[i] = llm.Sampling{Temperature: 1, MaxNewTokens: 8, Seed: int64(20 + i)}
	}
	gen := func() [][]int {
		out, err := p.GenerateIDs(context.Background(), prompts, settings)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([][]int, len(out))
		for i, c := range out {
			ids[i] = c.ResponseIDs
		}
		return ids
	}
	base := gen()
	release := p.HoldDecodingLayout()
	if held := gen(); !slices.EqualFunc(held, base, slices.Equal) {
		t.Fatalf("held layout %v, per-batch layout %v", held, base)
	}
	kept := p.layout.model
	if kept == nil {
		t.Fatal("no layout held after a call")
	}
	if again := gen(); !slices.EqualFunc(again, base, slices.Equal) || p.layout.model != kept {
		t.Fatal("the held layout was rebuilt within the hold: it is not kept between calls")
	}
	onTorch(t, func() error {
		return torch.NoGrad(func() error {
			for _, w := range m.Parameters() {
				w.T.MustMulScalar_(ts.FloatScalar(1.5))
			}
			return nil
		})
	})
	p.DropDecodingLayout()
	after := gen()
	inner := p.HoldDecodingLayout() // a nested hold, released first: the layout stays held
	inner()
	inner() // a second call of one release counts once
	if p.layout.holds != 1 || p.layout.model == nil {
		t.Fatalf("a nested hold's release left %d holds (layout kept: %v), want the outer hold and its layout", p.layout.holds, p.layout.model != nil)
	}
	release()
	if p.layout.scope != nil || p.layout.holds != 0 {
		t.Fatal("release left the layout held")
	}
	fresh := gen()
	if !slices.EqualFunc(after, fresh, slices.Equal) {
		t.Fatalf("after the drop %v, unheld %v: the new weights were not packed", after, fresh)
	}
	if slices.EqualFunc(fresh, base, slices.Equal) {
		t.Fatal("scaling every weight by 1.5 changed no token: the test is too weak")
	}
}
