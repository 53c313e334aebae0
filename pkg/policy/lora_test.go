package policy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/torch"
)

// testAdapter is a new adapter whose B (embed_tokens: A) is random N(0, bStd²) instead of zero,
// so that it changes the model's output.
func testAdapter(t testing.TB, m *Model, name string, cfg LoRAConfig, dt gotch.DType, seed int64, bStd float64) *Adapter {
	t.Helper()
	var a *Adapter
	err := torch.Do(func() error {
		var err error
		if a, err = NewAdapter(m, name, cfg, dt, seed); err != nil {
			return err
		}
		return torch.NoGrad(func() error {
			for i, p := range a.Parameters() {
				if strings.HasSuffix(p.Name, "lora_B.weight") || strings.HasSuffix(p.Name, "lora_embedding_A") {
					s := torch.NewScope()
					p.T.Copy_(ts.MustRandn(p.T.MustSize(), gotch.Double, gotch.CPU).MustMulScalar(ts.FloatScalar(bStd*float64(1+i%3)), true))
					s.Close()
				}
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The two adapters of the tests: different ranks and targets, so that a mixed batch pads ranks and
// leaves some projections (and embed_tokens) to one adapter only.
var (
	loraA = LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{arch.LoRAAllLinear, "embed_tokens", "lm_head"}}
	loraB = LoRAConfig{Rank: 2, Alpha: 3, Targets: []string{"v_proj", "q_proj", "down_proj", "lm_head"}}
)

func view(t testing.TB, m *Model, adapters []*Adapter, rows []int) *Model {
	t.Helper()
	v, err := m.WithAdapters(adapters, rows)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A new adapter (B = 0) computes exactly the base.
func TestNewAdapterIsTheBase(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 48, gotch.Double, 0.2, 3)
	onTorch(t, func() error {
		a, err := NewAdapter(m, "a", loraA, gotch.Double, 1)
		if err != nil {
			return err
		}
		defer a.Free()
		if got, want := a.NumParams(), int64(0); got == want {
			return fmt.Errorf("no parameters")
		}
		var embedding int
		for _, p := range a.Parameters() {
			vals := values(p.T)
			if strings.HasSuffix(p.Name, "lora_B.weight") && maxAbs(vals) != 0 {
				return fmt.Errorf("%s is not zero", p.Name)
			}
			switch { // PEFT's embedding LoRA: A zero, B standard normal
			case strings.HasSuffix(p.Name, "embed_tokens.lora_embedding_A") && maxAbs(vals) == 0:
				embedding++
			case strings.HasSuffix(p.Name, "embed_tokens.lora_embedding_B") && maxAbs(vals) > 1:
				embedding++
			}
			if strings.HasSuffix(p.Name, "lora_A.weight") {
				bound := 1 / math.Sqrt(float64(p.T.MustSize()[1]))
				if mx := maxAbs(vals); mx == 0 || mx > bound {
					return fmt.Errorf("%s: max |A| %g, want in (0, %g]", p.Name, mx, bound)
				}
			}
		}
		if embedding != 2 {
			return fmt.Errorf("embed_tokens: %d of its A (zero) and B (standard normal) initialised as PEFT does", embedding)
		}
		ids := idsTensor([]int{1, 5, 9, 2}, []int{3, 3, 7, 40})
		base := values(m.Forward(ids, nil, nil, nil))
		got := values(view(t, m, []*Adapter{a}, nil).Forward(ids, nil, nil, nil))
		if d := maxDiff(got, base); d != 0 {
			return fmt.Errorf("a new adapter changes the logits by %g", d)
		}
		return nil
	})
}

// In a mixed batch (rows on adapter a, adapter b and none) every row's logits are those of its
// adapter alone, for every family, and a merged model gives the adapter's logits.
func TestLoRAMixedForward(t *testing.T) {
	for _, family := range arch.ModelTypes() {
		t.Run(family, func(t *testing.T) {
			m := randomModel(t, family, 48, gotch.Double, 0.2, 5)
			a := testAdapter(t, m, "a", loraA, gotch.Double, 1, 0.2)
			b := testAdapter(t, m, "b", loraB, gotch.Double, 2, 0.3)
			onTorch(t, func() error {
				rng := rand.New(rand.NewPCG(1, 2))
				rows := [][]int{make([]int, 7), make([]int, 7), make([]int, 7), make([]int, 7)}
				for _, r := range rows {
					for j := range r {
						r[j] = rng.IntN(48)
					}
				}
				choice := []int{0, 1, -1, 0}
				mixed := view(t, m, []*Adapter{a, b}, choice).Forward(idsTensor(rows...), nil, nil, nil)
				for i, r := range rows {
					alone := m
					if choice[i] >= 0 {
						alone = view(t, m, []*Adapter{[]*Adapter{a, b}[choice[i]]}, nil)
					}
					want := values(alone.Forward(idsTensor(r), nil, nil, nil))
					got := values(mixed.MustSelect(0, int64(i), false))
					if d := maxDiff(got, want); d > 1e-10 {
						return fmt.Errorf("row %d (adapter %d): mixed batch differs from the adapter alone by %g", i, choice[i], d)
					}
					if choice[i] >= 0 {
						base := values(m.Forward(idsTensor(r), nil, nil, nil))
						if d := maxDiff(want, base); d < 1e-3 {
							return fmt.Errorf("row %d: the adapter changes the logits by only %g: the test shows nothing", i, d)
						}
					}
				}
				for _, ad := range []*Adapter{a, b} {
					merged, err := ad.Merge(m)
					if err != nil {
						return err
					}
					want := values(view(t, m, []*Adapter{ad}, nil).Forward(idsTensor(rows...), nil, nil, nil))
					got := values(merged.Forward(idsTensor(rows...), nil, nil, nil))
					merged.Free()
					if d := maxDiff(got, want); d > 1e-9 {
						return fmt.Errorf("adapter %s: merged model differs from the adapter by %g", ad.Name, d)
					}
				}
				return nil
			})
		})
	}
}

// Cached generation of a mixed batch (rows on a, b and none; rows finishing at different lengths,
// so the batch shrinks; the CPU decoding layout) gives every row exactly the greedy ids of full
// recompute on its adapter alone, of the row generated alone, and of the adapter's merged model,
// with the same log-probs. Through a Router, policies on one base share the call.
func TestLoRAMixedGeneration(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 300, gotch.Double, 0.3, 7)
	a := testAdapter(t, m, "a", loraA, gotch.Double, 1, 0.3)
	b := testAdapter(t, m, "b", loraB, gotch.Double, 2, 0.4)
	p := charPolicy(t, m)
	p.StopIDs = nil
	for _, ad := range []*Adapter{a, b} {
		if _, err := p.AddAdapter(ad); err != nil {
			t.Fatal(err)
		}
	}
	names := []string{"a", "b", "", "a", "b"}
	lengths := []int{12, 3, 9, 2, 12}
	settings := make([]llm.Sampling, len(prompts))
	opts := make([]RowOptions, len(prompts))
	for i := range settings {
		settings[i] = greedy(lengths[i])
		opts[i].Adapter = names[i]
	}
	batch, err := p.GenerateStream(context.Background(), prompts, settings, opts)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Adapter{"a": a, "b": b}
	differs := 0
	for i, pr := range prompts {
		ref := m
		if names[i] != "" {
			ref = view(t, m, []*Adapter{byName[names[i]]}, nil)
		}
		want := greedyRecompute(t, ref, pr, lengths[i])
		if !slices.Equal(batch[i].ResponseIDs, want) {
			t.Fatalf("row %d (adapter %q): mixed batch %v, full recompute on the adapter %v", i, names[i], batch[i].ResponseIDs, want)
		}
		if base := greedyRecompute(t, m, pr, lengths[i]); !slices.Equal(base, want) {
			differs++
		}
		alone, err := p.GenerateStream(context.Background(), [][]int{pr}, settings[i:i+1], opts[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(alone[0].ResponseIDs, want) {
			t.Fatalf("row %d: alone %v, in the mixed batch %v", i, alone[0].ResponseIDs, want)
		}
		if d := maxDiff(f64(alone[0].LogProbs), f64(batch[i].LogProbs)); d > 1e-5 {
			t.Fatalf("row %d: log-probs alone and in the mixed batch differ by %g", i, d)
		}
		if names[i] != "" {
			var merged *Model
			onTorchKeep(t, func() (err error) { merged, err = byName[names[i]].Merge(m); return })
			mp := charPolicy(t, merged)
			mp.StopIDs = nil
			got, err := mp.GenerateIDs(context.Background(), [][]int{pr}, settings[i:i+1])
			if err != nil {
				t.Fatal(err)
			}
			_ = torch.Do(func() error { merged.Free(); return nil })
			if !slices.Equal(got[0].ResponseIDs, want) {
				t.Fatalf("row %d: merged model %v, adapter %v", i, got[0].ResponseIDs, want)
			}
			if d := maxDiff(f64(got[0].LogProbs), f64(batch[i].LogProbs)); d > 1e-5 {
				t.Fatalf("row %d: log-probs of the merged model and the adapter differ by %g", i, d)
			}
		}
	}
	if differs < 2 {
		t.Fatalf("only %d adapter rows generate other ids than the base: the test shows little", differs)
	}

	// The same rows through two slots (continuous batching: rows take finished rows' slots with their
	// own adapters, and the last rows are decoded without the finished ones): the same ids and log-probs.
	p.MaxBatch = 2
	var cont []llm.Completion
	events, _ := traced(t, func() { cont, err = p.GenerateStream(context.Background(), prompts, settings, opts) })
	p.MaxBatch = 0
	if err != nil {
		t.Fatal(err)
	}
	if count(events, "join") == 0 || count(events, "live") == 0 {
		t.Fatalf("two slots: %v, want rows joining and live rows decoded alone", events)
	}
	for i := range prompts {
		if !slices.Equal(cont[i].ResponseIDs, batch[i].ResponseIDs) {
			t.Fatalf("row %d (adapter %q): %v through two slots, %v in one batch", i, names[i], cont[i].ResponseIDs, batch[i].ResponseIDs)
		}
		if d := maxDiff(f64(cont[i].LogProbs), f64(batch[i].LogProbs)); d > 1e-5 {
			t.Fatalf("row %d: log-probs through two slots and in one batch differ by %g", i, d)
		}
	}

	// A Router over the base's policy and two adapter policies: one batched call.
	pa, err := NewAdapterPolicy("sa", p, a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := NewAdapterPolicy("sb", p, b)
	if err != nil {
		t.Fatal(err)
	}
	pa.StopIDs, pb.StopIDs = nil, nil
	router := Router{"test": p, "sa": pa, "sb": pb}
	var reqs []llm.Request
	for i, model := range []string{"sa", "sb", "test", "sb", "sa"} {
		reqs = append(reqs, llm.Request{Agent: model, Model: model, Messages: []llm.Message{{Role: "user", Content: fmt.Sprintf("2+%d=", i)}}, Sampling: greedy(6)})
	}
	release := router.HoldDecodingLayout()
	got, err := router.Generate(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pa.Generate(context.Background(), reqs[:1]); err != nil {
		t.Fatal(err)
	}
	if p.layout.model == nil || pa.layout.model != nil || pb.layout.model != nil {
		t.Fatalf("held decoding layouts: base %v, adapters %v %v: want the base's only, shared", p.layout.model != nil, pa.layout.model != nil, pb.layout.model != nil)
	}
	release()
	for i, q := range reqs {
		alone, err := router[q.Model].Generate(context.Background(), []llm.Request{q})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got[i].ResponseIDs, alone[0].ResponseIDs) {
			t.Fatalf("router request %d (%s): %v in the shared batch, %v alone", i, q.Model, got[i].ResponseIDs, alone[0].ResponseIDs)
		}
	}
}

// onTorchKeep runs fn on the torch thread without a scope (what it makes outlives the call).
func onTorchKeep(t testing.TB, fn func() error) {
	t.Helper()
	if err := torch.Do(fn); err != nil {
		t.Fatal(err)
	}
}

func f64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// Training an adapter: TrainScore's pieced backward (with and without checkpointing) gives the
// adapter's A and B the gradients autograd gives through Score; the frozen base gets none.
func TestLoRAGradients(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 48, gotch.Double, 0.2, 5)
	a := testAdapter(t, m, "a", loraA, gotch.Double, 1, 0.2)
	rng := rand.New(rand.NewPCG(3, 4))
	seqs := make([]Sequence, 3)
	for i := range seqs {
		for range 4 + 3*i {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(48))
		}
		for range 9 - 2*i {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(48))
		}
	}
	onTorch(t, func() error {
		m.Freeze()
		v := view(t, m, []*Adapter{a}, nil)
		w := ts.MustRandn([]int64{3, 9}, gotch.Double, gotch.CPU)
		u := ts.MustRandn([]int64{3, 9}, gotch.Double, gotch.CPU)
		want, err := v.Score(seqs, true, 0)
		if err != nil {
			return err
		}
		gradLoss(want, w, u).MustBackward()
		ref := grads(v)
		if len(ref) != len(a.Parameters()) {
			return fmt.Errorf("autograd: %d of %d adapter tensors have a gradient", len(ref), len(a.Parameters()))
		}
		for k, g := range ref {
			if maxAbs(g) == 0 {
				return fmt.Errorf("autograd: %s has a zero gradient", k)
			}
		}
		for _, checkpoint := range []bool{false, true} {
			s := torch.NewScope()
			sc, bp, err := v.TrainScore(seqs, true, checkpoint)
			if err != nil {
				return err
			}
			bp.Backward(gradLoss(sc, w, u))
			got := grads(v)
			s.Close()
			for k, g := range ref {
				if d := maxDiff(got[k], g); d > 1e-9*(1+maxAbs(g)) {
					return fmt.Errorf("checkpoint %v: %s differs from autograd by %g", checkpoint, k, d)
				}
			}
			for _, p := range m.Parameters() {
				g := p.T.MustGrad(false)
				if g.MustDefined() {
					return fmt.Errorf("the frozen base's %s has a gradient", p.Name)
				}
			}
		}
		return nil
	})
}

// Scoring and training a mixed batch (rows on adapters a, b and none; a adapts embed_tokens,
// both lm_head) with lm_head taken in chunks that straddle rows: every row's log-probs are its
// adapter's alone, and each adapter's gradients are those of its own rows scored alone.
func TestLoRAMixedScoreAndTrain(t *testing.T) {
	m := randomModel(t, arch.Qwen2, 48, gotch.Double, 0.2, 5) // tied embeddings
	a := testAdapter(t, m, "a", loraA, gotch.Double, 1, 0.2)
	b := testAdapter(t, m, "b", loraB, gotch.Double, 2, 0.3)
	rng := rand.New(rand.NewPCG(5, 6))
	seqs := make([]Sequence, 4)
	for i := range seqs {
		for range 3 + i {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(48))
		}
		for range []int{9, 7, 9, 5}[i] {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(48))
		}
	}
	choice := []int{0, 1, -1, 0}
	weights := make([][]float64, len(seqs)) // per response token
	for i := range weights {
		for range 9 {
			weights[i] = append(weights[i], rng.NormFloat64())
		}
	}
	budget := logitsBudget
	logitsBudget = 16 * 48 // chunks of 16 of the 36 response positions: they straddle rows
	defer func() { logitsBudget = budget }()
	lossOf := func(sc Scores, rows []int) *ts.Tensor {
		R := sc.LogProbs.MustSize()[1]
		var w []float64
		for _, i := range rows {
			w = append(w, weights[i][:R]...)
		}
		wt := ts.MustOfSlice(w).MustView([]int64{int64(len(rows)), R}, true)
		return sc.LogProbs.MustMul(wt, false).MustSum(gotch.Invalid, true)
	}
	onTorch(t, func() error {
		m.Freeze()
		adapters := []*Adapter{a, b}
		mixed := view(t, m, adapters, choice)
		want, err := mixed.Score(seqs, false, 0)
		if err != nil {
			return err
		}
		s := torch.NewScope()
		sc, bp, err := mixed.TrainScore(seqs, false, false)
		if err != nil {
			return err
		}
		trained := values(sc.LogProbs)
		bp.Backward(lossOf(sc, []int{0, 1, 2, 3}))
		got := grads(mixed)
		s.Close()
		if d := maxDiff(trained, values(want.LogProbs)); d > 1e-12 {
			return fmt.Errorf("TrainScore and Score of the mixed batch differ by %g", d)
		}
		R := want.LogProbs.MustSize()[1]
		mixedLP := values(want.LogProbs)
		for i, sq := range seqs {
			alone := m
			if choice[i] >= 0 {
				alone = view(t, m, []*Adapter{adapters[choice[i]]}, nil)
			}
			ref, err := alone.Score([]Sequence{sq}, false, 0)
			if err != nil {
				return err
			}
			n := len(sq.ResponseIDs)
			if d := maxDiff(mixedLP[int64(i)*R:int64(i)*R+int64(n)], values(ref.LogProbs)[:n]); d > 1e-10 {
				return fmt.Errorf("row %d (adapter %d): mixed log-probs differ from the adapter alone by %g", i, choice[i], d)
			}
		}
		for k, ad := range adapters {
			var rows []int
			var sub []Sequence
			for i, c := range choice {
				if c == k {
					rows, sub = append(rows, i), append(sub, seqs[i])
				}
			}
			alone := view(t, m, []*Adapter{ad}, nil)
			s := torch.NewScope()
			sc, bp, err := alone.TrainScore(sub, false, true)
			if err != nil {
				return err
			}
			bp.Backward(lossOf(sc, rows))
			ref := grads(alone)
			s.Close()
			if len(ref) != len(ad.Parameters()) {
				return fmt.Errorf("adapter %s alone: %d of %d tensors have a gradient", ad.Name, len(ref), len(ad.Parameters()))
			}
			for name, g := range ref {
				if d := maxDiff(got[ad.Name+"/"+name], g); d > 1e-9*(1+maxAbs(g)) {
					return fmt.Errorf("adapter %s, %s: the mixed batch's gradient differs from its rows alone by %g", ad.Name, name, d)
				}
			}
		}
		return nil
	})
}

// Save → LoadAdapter is bit-equal, and the folder is in PEFT's format: adapter_config.json's
// fields, safetensors keys with PEFT's names, shapes [r, in] / [out, r] (embed_tokens:
// lora_embedding_A [r, vocab], lora_embedding_B [hidden, r]), dtype.
func TestAdapterSaveLoad(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 48, gotch.Float, 0.2, 5)
	lc := LoRAConfig{Rank: 2, Alpha: 3, Targets: []string{"lm_head", "v_proj", "embed_tokens", "q_proj", "down_proj"}}
	a := testAdapter(t, m, "a", lc, gotch.Float, 1, 0.2)
	a.BaseModel = "toy"
	dir := t.TempDir()
	onTorch(t, func() error {
		if err := a.Save(dir); err != nil {
			return err
		}
		back, err := LoadAdapter(dir, "a2", m, gotch.Float)
		if err != nil {
			return err
		}
		defer back.Free()
		want, got := a.Parameters(), back.Parameters()
		if len(got) != len(want) || len(want) != 2*3*m.Config.NumHiddenLayers+4 {
			return fmt.Errorf("%d tensors back, %d saved", len(got), len(want))
		}
		for i := range want {
			if got[i].Name != want[i].Name || !slices.Equal(values(got[i].T), values(want[i].T)) {
				return fmt.Errorf("%s: not bit-equal after a round trip", want[i].Name)
			}
		}
		if back.BaseModel != "toy" || back.Config.Scale() != a.Config.Scale() {
			return fmt.Errorf("config back: %+v base %q", back.Config, back.BaseModel)
		}
		return nil
	})
	var cfg map[string]any
	data, err := os.ReadFile(filepath.Join(dir, AdapterConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"peft_type": "LORA", "r": 2.0, "lora_alpha": 3.0, "lora_dropout": 0.0, "task_type": "CAUSAL_LM",
		"bias": "none", "fan_in_fan_out": false, "base_model_name_or_path": "toy", "use_dora": false, "use_rslora": false} {
		if cfg[k] != v {
			t.Errorf("adapter_config.json: %s = %v, want %v", k, cfg[k], v)
		}
	}
	if fmt.Sprint(cfg["target_modules"]) != "[q_proj v_proj down_proj embed_tokens lm_head]" {
		t.Errorf("target_modules %v", cfg["target_modules"])
	}
	hdr := adapterHeader(t, filepath.Join(dir, AdapterWeightsFile))
	c := m.Config
	for name, shape := range map[string][]int64{
		"base_model.model.model.embed_tokens.lora_embedding_A": {2, int64(c.VocabSize)},
		"base_model.model.model.embed_tokens.lora_embedding_B": {int64(c.HiddenSize), 2},
		"base_model.model.lm_head.lora_A.weight":               {2, int64(c.HiddenSize)},
		"base_model.model.lm_head.lora_B.weight":               {int64(c.VocabSize), 2},
	} {
		if e, ok := hdr[name]; !ok || e.DType != "F32" || !slices.Equal(e.Shape, shape) {
			t.Errorf("%s: %s: %+v (present %v), want F32%v", AdapterWeightsFile, name, e, ok, shape)
		}
	}
	for l := range c.NumHiddenLayers {
		for key, shape := range map[string][]int64{
			"self_attn.q_proj.lora_A": {2, int64(c.HiddenSize)}, "self_attn.q_proj.lora_B": {int64(c.NumAttentionHeads * c.HeadDim), 2},
			"self_attn.v_proj.lora_A": {2, int64(c.HiddenSize)}, "self_attn.v_proj.lora_B": {int64(c.NumKeyValueHeads * c.HeadDim), 2},
			"mlp.down_proj.lora_A": {2, int64(c.IntermediateSize)}, "mlp.down_proj.lora_B": {int64(c.HiddenSize), 2},
		} {
			name := fmt.Sprintf("base_model.model.model.layers.%d.%s.weight", l, key)
			e, ok := hdr[name]
			if !ok {
				t.Fatalf("%s: no tensor %s", AdapterWeightsFile, name)
			}
			if e.DType != "F32" || !slices.Equal(e.Shape, shape) {
				t.Errorf("%s: %s%v, want F32%v", name, e.DType, e.Shape, shape)
			}
		}
	}
	if len(hdr) != 6*c.NumHiddenLayers+4 {
		t.Errorf("%d tensors in %s, want %d", len(hdr), AdapterWeightsFile, 6*c.NumHiddenLayers+4)
	}
}

// adapterHeader parses a safetensors header by hand.
func adapterHeader(t *testing.T, path string) map[string]stEntry {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(data[:8])
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &raw); err != nil {
		t.Fatal(err)
	}
	out := map[string]stEntry{}
	for k, v := range raw {
		if k == "__metadata__" {
			continue
		}
		var e stEntry
		if err := json.Unmarshal(v, &e); err != nil {
			t.Fatal(err)
		}
		out[k] = e
	}
	return out
}

// handTensor is one tensor of a hand-written safetensors file.
type handTensor struct {
	name  string
	shape []int64
	vals  []float32
}

// writeHandSafetensors writes tensors (F32) as a safetensors file without the package's writer.
func writeHandSafetensors(t *testing.T, path string, tensors []handTensor) {
	t.Helper()
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	for _, x := range tensors {
		begin := len(data)
		for _, v := range x.vals {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
		}
		header[x.name] = map[string]any{"dtype": "F32", "shape": x.shape, "data_offsets": []int{begin, len(data)}}
	}
	hdr, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	out = append(append(out, hdr...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A PEFT-layout folder written here by hand (not by Save) loads, and the adapted model's logits are
// those of the base with W + (alpha/r)·B·A put into its q_proj, down_proj and lm_head weights and
// (alpha/r)·(B·A)ᵀ into its embeddings by hand; PEFT's copy of the base's embeddings beside them
// (save_embedding_layers) is accepted. Mismatched folders are refused with errors naming the file
// and the key.
func TestLoadHandWrittenPEFTAdapter(t *testing.T) {
	m := randomModel(t, arch.Llama, 48, gotch.Double, 0.2, 5)
	c := m.Config
	hidden, inter, q := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumAttentionHeads*c.HeadDim)
	const r, alpha = 2, 6.0
	rng := rand.New(rand.NewPCG(9, 9))
	randVals := func(n int64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.3)
		}
		return v
	}
	type pair struct{ a, b handTensor }
	var pairs []pair // layer-major: q_proj, down_proj
	var tensors []handTensor
	for l := range c.NumHiddenLayers {
		for _, pr := range []struct {
			mod     string
			in, out int64
		}{{"self_attn.q_proj", hidden, q}, {"mlp.down_proj", inter, hidden}} {
			key := fmt.Sprintf("base_model.model.model.layers.%d.%s", l, pr.mod)
			A := handTensor{key + ".lora_A.weight", []int64{r, pr.in}, randVals(r * pr.in)}
			B := handTensor{key + ".lora_B.weight", []int64{pr.out, r}, randVals(pr.out * r)}
			pairs = append(pairs, pair{A, B})
			tensors = append(tensors, B, A)
		}
	}
	vocab := int64(c.VocabSize)
	embA := handTensor{"base_model.model.model.embed_tokens.lora_embedding_A", []int64{r, vocab}, randVals(r * vocab)}
	embB := handTensor{"base_model.model.model.embed_tokens.lora_embedding_B", []int64{hidden, r}, randVals(hidden * r)}
	headA := handTensor{"base_model.model.lm_head.lora_A.weight", []int64{r, hidden}, randVals(r * hidden)}
	headB := handTensor{"base_model.model.lm_head.lora_B.weight", []int64{vocab, r}, randVals(vocab * r)}
	var embCopy handTensor
	onTorch(t, func() error {
		embCopy = handTensor{"base_model.model.model.embed_tokens.base_layer.weight", []int64{vocab, hidden}, nil}
		for _, v := range m.EmbedTokens.Float64Values() {
			embCopy.vals = append(embCopy.vals, float32(v))
		}
		return nil
	})
	tensors = append(tensors, embA, headB, embCopy, embB, headA)
	writeFolder := func(dir string, cfg map[string]any, ts []handTensor) {
		js, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), js, 0o644); err != nil {
			t.Fatal(err)
		}
		writeHandSafetensors(t, filepath.Join(dir, "adapter_model.safetensors"), ts)
	}
	peft := func() map[string]any {
		return map[string]any{"peft_type": "LORA", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": []string{"down_proj", "lm_head", "q_proj", "embed_tokens"},
			"base_model_name_or_path": "meta/llama", "task_type": "CAUSAL_LM", "bias": "none", "fan_in_fan_out": false, "inference_mode": true,
			"modules_to_save": nil, "layers_to_transform": nil, "rank_pattern": map[string]any{}, "alpha_pattern": map[string]any{}, "use_dora": false, "use_rslora": false}
	}
	dir := t.TempDir()
	writeFolder(dir, peft(), tensors)
	onTorch(t, func() error {
		a, err := LoadAdapter(dir, "hand", m, gotch.Double)
		if err != nil {
			return err
		}
		defer a.Free()
		if a.BaseModel != "meta/llama" || a.Config.Rank != r || !slices.Equal(a.Config.Targets, []string{"q_proj", "down_proj", "embed_tokens", "lm_head"}) {
			return fmt.Errorf("loaded config %+v base %q", a.Config, a.BaseModel)
		}
		ref, err := m.Clone()
		if err != nil {
			return err
		}
		defer ref.Free()
		err = torch.NoGrad(func() error {
			for i, pp := range pairs {
				l, proj := i/2, []int{0, 6}[i%2]
				A := ts.MustOfSlice(pp.a.vals).MustView(pp.a.shape, true).MustTotype(gotch.Double, true)
				B := ts.MustOfSlice(pp.b.vals).MustView(pp.b.shape, true).MustTotype(gotch.Double, true)
				w := ref.Layers[l].(*decoderLayer).projections()[proj].lin.Weight
				w.Copy_(w.MustAdd(B.MustMatmul(A, true).MustMulScalar(ts.FloatScalar(alpha/r), true), false))
			}
			tensor := func(h handTensor) *ts.Tensor {
				return ts.MustOfSlice(h.vals).MustView(h.shape, true).MustTotype(gotch.Double, true)
			}
			ref.EmbedTokens.Copy_(ref.EmbedTokens.MustAdd(tensor(embB).MustMatmul(tensor(embA), true).MustT(true).MustMulScalar(ts.FloatScalar(alpha/r), true), false))
			ref.LMHead.Copy_(ref.LMHead.MustAdd(tensor(headB).MustMatmul(tensor(headA), true).MustMulScalar(ts.FloatScalar(alpha/r), true), false))
			return nil
		})
		if err != nil {
			return err
		}
		ids := idsTensor([]int{1, 5, 9, 2, 7}, []int{3, 3, 7, 40, 11})
		want := values(ref.Forward(ids, nil, nil, nil))
		got := values(view(t, m, []*Adapter{a}, nil).Forward(ids, nil, nil, nil))
		if d := maxDiff(got, want); d > 1e-9 {
			return fmt.Errorf("hand-written adapter: logits differ from the hand-merged base by %g", d)
		}
		if d := maxDiff(got, values(m.Forward(ids, nil, nil, nil))); d < 1e-3 {
			return fmt.Errorf("the adapter changes the logits by only %g", d)
		}
		return nil
	})

	// Refusals: each names the file and the key.
	for _, c := range []struct {
		name string
		edit func(cfg map[string]any) []handTensor
		want []string
	}{
		{"rank mismatch", func(cfg map[string]any) []handTensor { cfg["r"] = 3; return tensors },
			[]string{"adapter_model.safetensors", "lora_A.weight has shape [2"}},
		{"tensor of an untargeted module", func(cfg map[string]any) []handTensor { cfg["target_modules"] = []string{"q_proj"}; return tensors },
			[]string{"adapter_model.safetensors", "mlp.down_proj.lora_", "not in target_modules"}},
		{"missing tensor", func(cfg map[string]any) []handTensor { return tensors[1:] },
			[]string{"adapter_model.safetensors", "missing tensor base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"}},
		{"dora", func(cfg map[string]any) []handTensor { cfg["use_dora"] = true; return tensors },
			[]string{"adapter_config.json", "use_dora"}},
		{"regex targets", func(cfg map[string]any) []handTensor { cfg["target_modules"] = ".*proj"; return tensors },
			[]string{"adapter_config.json", "target_modules", "regular expression"}},
		{"embedding tensor of an untargeted embed_tokens", func(cfg map[string]any) []handTensor {
			cfg["target_modules"] = []string{"q_proj", "down_proj", "lm_head"}
			return tensors
		},
			[]string{"adapter_model.safetensors", "embed_tokens.lora_embedding_A", "not in target_modules"}},
		{"a base copy that is not the base's", func(cfg map[string]any) []handTensor {
			other := embCopy
			other.vals = randVals(int64(len(embCopy.vals)))
			return append(slices.Clone(tensors[:len(tensors)-3]), other, embB, headA)
		},
			[]string{"adapter_model.safetensors", "embed_tokens.base_layer.weight", "differs from the base's embed_tokens"}},
		{"unknown module", func(cfg map[string]any) []handTensor {
			return append(slices.Clone(tensors), handTensor{"base_model.model.model.norm.lora_A.weight", []int64{r, hidden}, randVals(r * hidden)})
		},
			[]string{"adapter_model.safetensors", "model.norm.lora_A.weight", "not a LoRA weight this package adapts"}},
		{"dropout", func(cfg map[string]any) []handTensor { cfg["lora_dropout"] = 0.1; return tensors },
			[]string{"adapter_config.json", "dropout 0.1"}},
	} {
		dir := t.TempDir()
		cfg := peft()
		writeFolder(dir, cfg, c.edit(cfg))
		writeFolder(dir, cfg, c.edit(cfg))
		err := torch.Do(func() error {
			a, err := LoadAdapter(dir, "bad", m, gotch.Double)
			if err == nil {
				a.Free()
			}
			return err
		})
		if err == nil {
			t.Errorf("%s: loaded", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", c.name, err, w)
			}
		}
	}
}
