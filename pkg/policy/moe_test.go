package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
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

// moeGolden is a Qwen3-MoE golden folder's reference (testdata/golden.py: a float64 transcription
// of transformers' modeling_qwen3_moe.py).
type moeGolden struct {
	IDs    [][]int       `json:"ids"`
	Logits [][][]float64 `json:"logits"`
	Routes [][][][]int   `json:"routes"` // [row][token][layer][k], −1 in dense layers
	Greedy struct {
		Prompt, Tokens []int
	} `json:"greedy"`
	Aux struct {
		IDs  [][]int `json:"ids"`
		Mask [][]int `json:"mask"`
		Loss float64 `json:"loss"`
	} `json:"aux"`
}

// moeGoldens are the Qwen3-MoE folders: top-2 of 4 experts renormalized, a dense first layer by
// mlp_only_layers, float32 on disk; and not renormalized, a dense first layer by
// decoder_sparse_step, tied embeddings, bfloat16 on disk.
var moeGoldens = []string{"qwen3_moe", "qwen3_moe-nonorm"}

func readMoEGolden(t *testing.T, name string) (dir string, g moeGolden) {
	t.Helper()
	dir = filepath.Join("testdata", "golden", name)
	data, err := os.ReadFile(filepath.Join(dir, "logits.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return dir, g
}

// logSoftmax is log-softmax over the last dimension of rows of logits.
func logSoftmax(z []float64) []float64 {
	top := slices.Max(z)
	var s float64
	for _, v := range z {
		s += math.Exp(v - top)
	}
	out := make([]float64, len(z))
	for i, v := range z {
		out[i] = v - top - math.Log(s)
	}
	return out
}

// Parity with transformers' Qwen3-MoE (testdata/golden.py's float64 reference of
// modeling_qwen3_moe.py), both folders, loaded in float32 and in float64: the logits of every
// position and the log-probs of each row's tokens (Score) within 1e-4 (float32) and 1e-9 (float64),
// the experts of every token (Score's Record) and the greedy continuation of a prompt equal.
func TestMoEGoldenParity(t *testing.T) {
	for _, name := range moeGoldens {
		for _, tc := range []struct {
			dt  gotch.DType
			tol float64
		}{{gotch.Float, 1e-4}, {gotch.Double, 1e-9}} {
			t.Run(fmt.Sprintf("%s-%v", name, tc.dt), func(t *testing.T) {
				dir, g := readMoEGolden(t, name)
				var m *Model
				onTorchKeep(t, func() error {
					var err error
					m, err = Load(dir, gotch.CPU, tc.dt)
					return err
				})
				defer func() { _ = torch.Do(func() error { m.Free(); return nil }) }()
				onTorch(t, func() error {
					got := values(m.Forward(idsTensor(g.IDs...), nil, nil, nil))
					V := m.Config.VocabSize
					var worst, worstLP float64
					seqs := make([]Sequence, len(g.IDs))
					recs := make([]Routes, len(g.IDs))
					for b, row := range g.Logits {
						seqs[b] = Sequence{PromptIDs: g.IDs[b][:1], ResponseIDs: g.IDs[b][1:], Record: &recs[b]}
						for i, pos := range row {
							for v, want := range pos {
								worst = max(worst, math.Abs(got[(b*len(row)+i)*V+v]-want))
							}
						}
					}
					if worst > tc.tol {
						return fmt.Errorf("logits differ from the reference by %.3g", worst)
					}
					sc, err := m.Score(seqs, false, 0)
					if err != nil {
						return err
					}
					lps := values(sc.LogProbs)
					for b, row := range g.Logits {
						for i := range len(row) - 1 {
							want := logSoftmax(row[i])[g.IDs[b][i+1]]
							worstLP = max(worstLP, math.Abs(lps[b*(len(row)-1)+i]-want))
						}
					}
					if worstLP > tc.tol {
						return fmt.Errorf("log-probs differ from the reference by %.3g", worstLP)
					}
					for b, rec := range recs {
						if rec.Tokens() != len(g.IDs[b]) {
							return fmt.Errorf("row %d: %d tokens recorded, want %d", b, rec.Tokens(), len(g.IDs[b]))
						}
						for i := range g.Routes[b] {
							for l, want := range g.Routes[b][i] {
								gotIDs := rec.IDs[(i*rec.Layers+l)*rec.TopK:][:rec.TopK]
								for k := range want {
									if int(gotIDs[k]) != want[k] {
										return fmt.Errorf("row %d token %d layer %d: experts %v, reference %v", b, i, l, gotIDs, want)
									}
								}
							}
						}
					}
					t.Logf("max |Δ| vs the float64 reference: logits %.2g, log-probs %.2g", worst, worstLP)
					return nil
				})
				p := &Policy{ID: name, Model: m, Device: gotch.CPU}
				var rec Routes
				out, err := p.GenerateStream(context.Background(), [][]int{g.Greedy.Prompt}, []llm.Sampling{{MaxNewTokens: len(g.Greedy.Tokens)}},
					[]RowOptions{{Record: &rec}})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(out[0].ResponseIDs, g.Greedy.Tokens) {
					t.Fatalf("greedy %v, reference %v", out[0].ResponseIDs, g.Greedy.Tokens)
				}
				// Generation records what a forward of the whole sequence routes (but the last token).
				full := append(slices.Clone(g.Greedy.Prompt), g.Greedy.Tokens...)
				var want Routes
				onTorch(t, func() error {
					_, err := m.Score([]Sequence{{PromptIDs: full[:1], ResponseIDs: full[1:], Record: &want}}, false, 0)
					return err
				})
				if rec.Tokens() != len(full)-1 || !slices.Equal(rec.IDs, want.IDs[:len(rec.IDs)]) {
					t.Fatalf("generation recorded %d tokens %v, a forward of the sequence routes %v", rec.Tokens(), rec.IDs, want.IDs)
				}
			})
		}
	}
}

// auxSeqs are golden.py's load-balancing batch as sequences: its mask's real tokens, each row cut
// into a prompt and a response (TrainScore right-pads them back into golden.py's layout).
func auxSeqs(g moeGolden) []Sequence {
	var seqs []Sequence
	for b, row := range g.Aux.IDs {
		n := 0
		for _, v := range g.Aux.Mask[b] {
			n += v
		}
		seqs = append(seqs, Sequence{PromptIDs: row[:n/2], ResponseIDs: row[n/2 : n]})
	}
	return seqs
}

// nudge adds by to element i of t (a parameter), in place, on the torch thread: the grad mode is
// the thread's, and off it a goroutine moved between threads could run the in-place add with
// gradients on (libtorch then refuses it on a leaf's view, as a CI run saw).
func nudge(t *ts.Tensor, i int64, by float64) {
	_ = torch.Do(func() error {
		return torch.NoGrad(func() error {
			s := torch.NewScope()
			defer s.Close()
			t.MustView([]int64{-1}, false).MustNarrow(0, i, 1, true).MustAddScalar_(ts.FloatScalar(by))
			return nil
		})
	})
}

// The router's load-balancing loss (Scores.RouterAux) is transformers' load_balancing_loss_func
// over the sparse layers, the padding masked out (golden.py's reference: within 1e-12 in float64,
// 1e-5 in float32); and TrainScore's pieced backward gives it the gradient central differences of
// its value give, for a router weight and for an attention weight of the dense layer below (the
// loss reaches it through the hidden states), alone and added to a loss on the log-probs, with and
// without checkpointing.
func TestMoEAuxLoss(t *testing.T) {
	for _, name := range moeGoldens {
		dir, g := readMoEGolden(t, name)
		for _, dt := range []gotch.DType{gotch.Float, gotch.Double} {
			var m *Model
			onTorchKeep(t, func() error {
				var err error
				m, err = Load(dir, gotch.CPU, dt)
				return err
			})
			seqs := auxSeqs(g)
			value := func(checkpoint bool) float64 {
				var v float64
				onTorch(t, func() error {
					sc, _, err := m.TrainScore(seqs, false, checkpoint)
					if err != nil {
						return err
					}
					v = values(sc.RouterAux)[0]
					return nil
				})
				return v
			}
			tol := 1e-5
			if dt == gotch.Double {
				tol = 1e-12
			}
			for _, checkpoint := range []bool{false, true} {
				if got := value(checkpoint); math.Abs(got-g.Aux.Loss) > tol*g.Aux.Loss {
					t.Fatalf("%s %v checkpoint %v: load-balancing loss %.12g, reference %.12g", name, dt, checkpoint, got, g.Aux.Loss)
				}
			}
			if dt == gotch.Double {
				checkAuxGradient(t, m, seqs, value)
			}
			_ = torch.Do(func() error { m.Free(); return nil })
		}
	}
}

// checkAuxGradient compares Backward's gradients of RouterAux (and of RouterAux plus the log-probs'
// sum) with central differences of value (RouterAux computed anew).
func checkAuxGradient(t *testing.T, m *Model, seqs []Sequence, value func(bool) float64) {
	t.Helper()
	sparse := 0
	for !m.opts.MoE.SparseLayer(sparse) {
		sparse++
	}
	params := map[string]*ts.Tensor{}
	for _, p := range m.Parameters() {
		params[p.Name] = p.T
	}
	probes := []struct {
		name string
		i    int64
	}{{fmt.Sprintf("model.layers.%d.mlp.gate.weight", sparse), 5}, {fmt.Sprintf("model.layers.%d.mlp.gate.weight", sparse), 37},
		{"model.layers.0.self_attn.q_proj.weight", 11}}
	for _, withLP := range []bool{false, true} {
		for _, checkpoint := range []bool{false, true} {
			got := map[int]float64{}
			onTorch(t, func() error {
				sc, bp, err := m.TrainScore(seqs, false, checkpoint)
				if err != nil {
					return err
				}
				loss := sc.RouterAux
				if withLP {
					loss = loss.MustAdd(sc.LogProbs.MustSum(gotch.Invalid, false), false)
				}
				bp.Backward(loss)
				for k, pr := range probes {
					got[k] = params[pr.name].MustGrad(false).MustView([]int64{-1}, false).Float64Values()[pr.i]
				}
				grads(m)
				return nil
			})
			for k, pr := range probes {
				const h = 1e-5
				f := func(by float64) float64 {
					nudge(params[pr.name], pr.i, by)
					defer nudge(params[pr.name], pr.i, -by)
					v := value(false)
					if withLP {
						onTorch(t, func() error {
							sc, err := m.Score(seqs, false, 0)
							v += values(sc.LogProbs.MustSum(gotch.Invalid, false))[0]
							return err
						})
					}
					return v
				}
				want := (f(h) - f(-h)) / (2 * h)
				if math.Abs(got[k]-want) > 1e-6*(1+math.Abs(want)) || (k < 2 && want == 0) {
					t.Errorf("%s[%d] (log-probs too %v, checkpoint %v): gradient %.10g, central differences %.10g", pr.name, pr.i, withLP, checkpoint, got[k], want)
				}
			}
		}
	}
}

// coldExpertModel is a float64 Qwen3-MoE (layer 1 sparse: top-2 of 4 experts, renormalized) whose
// router never picks expert 3: every token's embedding has 20 in feature 0, which the router's
// rows 0–2 weigh by 2 and row 3 by 0. heat makes expert 3 every token's first pick instead (row 3
// weighs feature 0 by 4), without changing the logits of experts 0–2: their renormalized weights,
// and so a replay of routes recorded before, are unchanged.
func coldExpertModel(t *testing.T) (m *Model, heat func()) {
	m = randomModel(t, "qwen3_moe", 48, gotch.Double, 0.3, 11)
	router := m.Layers[1].(*decoderLayer).MLP.(*sparseMLP).Gate.Weight
	set := func(t *ts.Tensor, row, col int64, v float64) {
		s := torch.NewScope()
		defer s.Close()
		t.MustNarrow(0, row, 1, false).MustNarrow(1, col, 1, true).MustFill_(ts.FloatScalar(v))
	}
	onTorchKeep(t, func() error {
		return torch.NoGrad(func() error {
			for v := range int64(48) {
				set(m.EmbedTokens, v, 0, 20)
			}
			for e := range int64(3) {
				set(router, e, 0, 2)
			}
			set(router, 3, 0, 0)
			return nil
		})
	})
	return m, func() {
		onTorchKeep(t, func() error { return torch.NoGrad(func() error { set(router, 3, 0, 4); return nil }) })
	}
}

// Routing replay: with routes recorded by a pass (and by generation), the router perturbed so that
// every token's live top-2 changes, a replaying pass gives the recording pass's log-probs in float64
// to 1e-9 — Score, TrainScore (with and without checkpointing) and generation (prefill and
// decoding) alike — while without replay they differ; RouteStats count every token's live top-k as
// changed, and the experts used as changed only without replay (0 with it, and 0 live changes before
// the perturbation). Under replay the router still gets the gradient autograd gives it (TrainScore's
// pieces against autograd through Score), non-zero for the replayed experts' rows.
func TestMoEReplay(t *testing.T) {
	m, heat := coldExpertModel(t)
	rng := rand.New(rand.NewPCG(1, 2))
	seqs := make([]Sequence, 3)
	recs := make([]Routes, len(seqs))
	tokens := int64(0)
	for i := range seqs {
		for range 3 + 2*i {
			seqs[i].PromptIDs = append(seqs[i].PromptIDs, rng.IntN(48))
		}
		for range 7 - i {
			seqs[i].ResponseIDs = append(seqs[i].ResponseIDs, rng.IntN(48))
		}
		seqs[i].Record = &recs[i]
		tokens += int64(len(seqs[i].PromptIDs) + len(seqs[i].ResponseIDs))
	}
	score := func(seqs []Sequence) (lp []float64, st *RouteStats) {
		onTorch(t, func() error {
			sc, err := m.Score(seqs, false, 2) // micro-batches: the counts add up
			lp, st = values(sc.LogProbs), sc.Routes
			return err
		})
		return lp, st
	}
	want, _ := score(seqs)
	for i, r := range recs {
		for tok := range r.Tokens() {
			if slices.Contains(r.IDs[(tok*r.Layers+1)*r.TopK:][:r.TopK], 3) {
				t.Fatalf("sequence %d token %d: the cold expert was picked: the test's construction failed", i, tok)
			}
		}
	}
	p := &Policy{ID: "moe", Model: m, Device: gotch.CPU}
	prompts := [][]int{seqs[0].PromptIDs, seqs[2].PromptIDs}
	settings := []llm.Sampling{{MaxNewTokens: 9}, {Temperature: 1, MaxNewTokens: 7, Seed: 5}}
	genRecs := make([]Routes, 2)
	gen0, err := p.GenerateStream(context.Background(), prompts, settings, []RowOptions{{Record: &genRecs[0]}, {Record: &genRecs[1]}})
	if err != nil {
		t.Fatal(err)
	}
	replay := func(on bool) []Sequence {
		out := make([]Sequence, len(seqs))
		for i, s := range seqs {
			out[i] = Sequence{PromptIDs: s.PromptIDs, ResponseIDs: s.ResponseIDs, Routes: &recs[i], Replay: on}
		}
		return out
	}
	counts := func(st *RouteStats) (n, live, used int64) {
		return st.Tokens[1], st.Live[1], st.Used[1]
	}
	if _, st := score(replay(false)); st == nil || st.Tokens[0] != 0 {
		t.Fatalf("stats %+v: want counts in the sparse layer only", st)
	} else if n, live, used := counts(st); n != tokens || live != 0 || used != 0 {
		t.Fatalf("before the perturbation: %d tokens, %d live and %d used changes; want %d, 0, 0", n, live, used, tokens)
	}

	heat()
	got, st := score(replay(true))
	if d := maxDiff(got, want); d > 1e-9 {
		t.Fatalf("replayed log-probs differ from the recording pass's by %.3g", d)
	}
	if n, live, used := counts(st); n != tokens || live != tokens || used != 0 {
		t.Fatalf("replay: %d tokens, %d live and %d used changes; want %d, %d, 0", n, live, used, tokens, tokens)
	}
	off, st := score(replay(false))
	if d := maxDiff(off, want); d < 1e-3 {
		t.Fatalf("without replay the log-probs differ by only %.3g: the perturbation changed nothing", d)
	}
	if n, live, used := counts(st); n != tokens || live != tokens || used != tokens {
		t.Fatalf("no replay: %d tokens, %d live and %d used changes; want %d each", n, live, used, tokens)
	}
	t.Logf("replay: log-probs within %.2g of the recording pass's; without: %.2g apart; live top-2 changed for %d of %d tokens",
		maxDiff(got, want), maxDiff(off, want), tokens, tokens)

	checkReplayGradients(t, m, replay(true), want)

	gen1, err := p.GenerateStream(context.Background(), prompts, settings, []RowOptions{{Replay: &genRecs[0]}, {Replay: &genRecs[1]}})
	if err != nil {
		t.Fatal(err)
	}
	gen2, err := p.GenerateIDs(context.Background(), prompts, settings)
	if err != nil {
		t.Fatal(err)
	}
	for i := range gen0 {
		if !slices.Equal(gen1[i].ResponseIDs, gen0[i].ResponseIDs) || maxDiff(f64(gen1[i].LogProbs), f64(gen0[i].LogProbs)) > 1e-6 {
			t.Fatalf("row %d: replayed generation %v %v, recorded %v %v", i, gen1[i].ResponseIDs, gen1[i].LogProbs, gen0[i].ResponseIDs, gen0[i].LogProbs)
		}
		if slices.Equal(gen2[i].ResponseIDs, gen0[i].ResponseIDs) && maxDiff(f64(gen2[i].LogProbs), f64(gen0[i].LogProbs)) < 1e-3 {
			t.Fatalf("row %d: generation without replay is the recorded one", i)
		}
	}
}

// checkReplayGradients: TrainScore replaying seqs' routes gives the log-probs want to 1e-9 and the
// gradients autograd gives through Score (replaying too), the router's non-zero.
func checkReplayGradients(t *testing.T, m *Model, seqs []Sequence, want []float64) {
	t.Helper()
	onTorch(t, func() error {
		sc, err := m.Score(seqs, false, 0)
		if err != nil {
			return err
		}
		sc.LogProbs.MustSum(gotch.Invalid, false).MustBackward()
		ref := grads(m)
		router := "model.layers.1.mlp.gate.weight"
		for e := range 3 {
			if maxAbs(ref[router][e*32:(e+1)*32]) == 0 {
				return fmt.Errorf("autograd: the router's row %d has no gradient under replay", e)
			}
		}
		for _, checkpoint := range []bool{false, true} {
			s := torch.NewScope()
			sc, bp, err := m.TrainScore(seqs, false, checkpoint)
			if err != nil {
				return err
			}
			if d := maxDiff(values(sc.LogProbs), want); d > 1e-9 {
				return fmt.Errorf("TrainScore (checkpoint %v) replayed: log-probs differ from the recording pass's by %.3g", checkpoint, d)
			}
			bp.Backward(sc.LogProbs.MustSum(gotch.Invalid, false))
			got := grads(m)
			s.Close()
			if len(got) != len(ref) {
				return fmt.Errorf("checkpoint %v: %d parameters have a gradient, autograd gives %d", checkpoint, len(got), len(ref))
			}
			for k, g := range ref {
				if d := maxDiff(got[k], g); d > 1e-9*(1+maxAbs(g)) {
					return fmt.Errorf("checkpoint %v: %s differs from autograd by %.3g", checkpoint, k, d)
				}
			}
		}
		return nil
	})
}

// denseMoE is the mixture of experts computed densely (the reference for the grouped one): every
// expert on every token, each output weighted by the token's weight for that expert (zero unless
// among its top k), all in one sum.
func denseMoE(s *sparseMLP, x *ts.Tensor) *ts.Tensor {
	size := x.MustSize()
	flat := x.MustReshape([]int64{-1, size[2]}, false)
	probs := ts.MustLinear(flat, s.Gate.Weight, ts.None).MustSoftmax(-1, gotch.Double, true)
	w, idx := probs.MustTopk(s.topK, -1, true, true, false)
	if s.norm {
		w = w.MustDiv(w.MustSumDimIntlist([]int64{-1}, true, gotch.Invalid, false), true)
	}
	var out *ts.Tensor
	for e, ex := range s.Experts.list {
		coef := w.MustMul(idx.MustEq(ts.IntScalar(int64(e)), false).MustTotype(gotch.Double, true), false).MustSumDimIntlist([]int64{-1}, true, gotch.Invalid, true)
		h := ts.MustLinear(flat, ex.GateProj.Weight, ts.None).MustSilu(true).MustMul(ts.MustLinear(flat, ex.UpProj.Weight, ts.None), true)
		y := ts.MustLinear(h, ex.DownProj.Weight, ts.None).MustMul(coef, true)
		if out == nil {
			out = y
		} else {
			out = out.MustAdd(y, true)
		}
	}
	return out.MustView(size, true)
}

// The grouped mixture of experts (tokens sorted by expert, one product per expert over its tokens,
// index_add back) equals the dense computation of every expert on every token, in float64, forward
// and backward (the input's gradient, the router's and every expert's), renormalized or not.
func TestMoEGroupedMatchesDense(t *testing.T) {
	for _, norm := range []bool{true, false} {
		c := tinyConfig("qwen3_moe", 48)
		c.SetRaw("num_experts", 8)
		c.SetRaw("num_experts_per_tok", 3)
		c.SetRaw("norm_topk_prob", norm)
		var m *Model
		onTorchKeep(t, func() error {
			var err error
			m, err = NewRandom(c, gotch.CPU, gotch.Double, 4)
			return err
		})
		s := m.Layers[1].(*decoderLayer).MLP.(*sparseMLP)
		onTorch(t, func() error {
			x := ts.MustRandn([]int64{3, 7, int64(c.HiddenSize)}, gotch.Double, gotch.CPU).MustSetRequiresGrad(true, false)
			r := ts.MustRandn([]int64{3, 7, int64(c.HiddenSize)}, gotch.Double, gotch.CPU)
			run := func(f func() *ts.Tensor) (y []float64, g map[string][]float64) {
				out := f()
				out.MustMul(r, false).MustSum(gotch.Invalid, true).MustBackward()
				g = grads(m)
				g["x"] = x.MustGrad(false).Float64Values()
				x.MustGrad(false).MustZero_()
				return values(out), g
			}
			got, gotG := run(func() *ts.Tensor { return s.forward(x, &pass{m: m, layer: 1}) })
			want, wantG := run(func() *ts.Tensor { return denseMoE(s, x) })
			if d := maxDiff(got, want); d > 1e-12 {
				return fmt.Errorf("norm %v: grouped output differs from the dense one by %.3g", norm, d)
			}
			if len(gotG) != len(wantG) || len(gotG) < 2+3*4 {
				return fmt.Errorf("norm %v: %d tensors with a gradient, dense %d", norm, len(gotG), len(wantG))
			}
			for k, g := range wantG {
				if d := maxDiff(gotG[k], g); d > 1e-12*(1+maxAbs(g)) || maxAbs(g) == 0 {
					return fmt.Errorf("norm %v: gradient of %s differs from the dense one's by %.3g (scale %.3g)", norm, k, d, maxAbs(g))
				}
			}
			return nil
		})
		_ = torch.Do(func() error { m.Free(); return nil })
	}
}

// LoRA on a mixture of experts: all-linear adapts q, k, v, o and every expert's gate, up and down
// projections under PEFT's names (mlp.experts.{j}.…), not the router; training the adapter on a
// frozen base gives each expert's A and B the gradient autograd gives (TrainScore's pieces, with
// and without checkpointing) and the base none; the adapter saves and loads back bit-equal with the
// same logits, and a file adapting the router is refused naming the tensor.
func TestMoELoRA(t *testing.T) {
	m := randomModel(t, "qwen3_moe", 48, gotch.Double, 0.2, 5)
	a := testAdapter(t, m, "a", loraA, gotch.Double, 1, 0.2)
	names := map[string][]int64{}
	for _, p := range a.Parameters() {
		names[p.Name] = p.T.MustSize()
	}
	c := m.Config
	for key, shape := range map[string][]int64{
		"base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight": {4, int64(c.HiddenSize)},
		"base_model.model.model.layers.1.mlp.experts.0.down_proj.lora_A.weight": {4, 24},
		"base_model.model.model.layers.1.mlp.experts.2.up_proj.lora_B.weight":   {24, 4},
		"base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight":           {int64(c.IntermediateSize), 4},
	} {
		if !slices.Equal(names[key], shape) {
			t.Errorf("%s: shape %v, want %v", key, names[key], shape)
		}
	}
	for n := range names {
		if strings.Contains(n, "mlp.gate.") {
			t.Errorf("all-linear adapts the router: %s", n)
		}
	}
	if n, err := arch.LoRAParams(c, 4, loraA.Targets); err != nil || n != a.NumParams() {
		t.Errorf("arch.LoRAParams %d (%v), the adapter holds %d", n, err, a.NumParams())
	}

	seqs := randomSequences(3, 48, 9)
	onTorch(t, func() error {
		m.Freeze()
		defer m.Thaw()
		v := view(t, m, []*Adapter{a}, nil)
		want, err := v.Score(seqs, false, 0)
		if err != nil {
			return err
		}
		want.LogProbs.MustSum(gotch.Invalid, false).MustBackward()
		ref := grads(v)
		for _, k := range []string{"base_model.model.model.layers.1.mlp.experts.1.up_proj.lora_A.weight", "base_model.model.model.layers.1.mlp.experts.1.up_proj.lora_B.weight"} {
			if maxAbs(ref[k]) == 0 {
				return fmt.Errorf("autograd: %s has no gradient", k)
			}
		}
		if len(ref) != len(a.Parameters()) {
			return fmt.Errorf("autograd: %d of %d adapter tensors have a gradient", len(ref), len(a.Parameters()))
		}
		for _, checkpoint := range []bool{false, true} {
			s := torch.NewScope()
			sc, bp, err := v.TrainScore(seqs, false, checkpoint)
			if err != nil {
				return err
			}
			bp.Backward(sc.LogProbs.MustSum(gotch.Invalid, false))
			got := grads(v)
			s.Close()
			for k, g := range ref {
				if d := maxDiff(got[k], g); d > 1e-9*(1+maxAbs(g)) {
					return fmt.Errorf("checkpoint %v: %s differs from autograd by %g", checkpoint, k, d)
				}
			}
			for _, p := range m.Parameters() {
				if g := p.T.MustGrad(false); g.MustDefined() {
					return fmt.Errorf("the frozen base's %s has a gradient", p.Name)
				}
			}
		}
		return nil
	})

	dir := t.TempDir()
	onTorch(t, func() error {
		if err := a.Save(dir); err != nil {
			return err
		}
		back, err := LoadAdapter(dir, "a2", m, gotch.Double)
		if err != nil {
			return err
		}
		defer back.Free()
		ids := idsTensor([]int{1, 5, 9, 2, 7}, []int{3, 3, 7, 40, 11})
		if d := maxDiff(values(view(t, m, []*Adapter{back}, nil).Forward(ids, nil, nil, nil)), values(view(t, m, []*Adapter{a}, nil).Forward(ids, nil, nil, nil))); d != 0 {
			return fmt.Errorf("loaded back, the adapter's logits differ by %g", d)
		}
		return nil
	})
	hdr := adapterHeader(t, filepath.Join(dir, AdapterWeightsFile))
	if e, ok := hdr["base_model.model.model.layers.1.mlp.experts.3.down_proj.lora_B.weight"]; !ok || !slices.Equal(e.Shape, []int64{int64(c.HiddenSize), 4}) {
		t.Errorf("%s: experts.3.down_proj.lora_B: %+v (present %v)", AdapterWeightsFile, e, ok)
	}
	writeHandSafetensors(t, filepath.Join(dir, AdapterWeightsFile), []handTensor{
		{"base_model.model.model.layers.1.mlp.gate.lora_A.weight", []int64{4, int64(c.HiddenSize)}, make([]float32, 4*c.HiddenSize)}})
	onTorch(t, func() error {
		_, err := LoadAdapter(dir, "router", m, gotch.Double)
		if err == nil || !strings.Contains(err.Error(), "mlp.gate.lora_A.weight") {
			return fmt.Errorf("an adapter of the router: %v, want an error naming the tensor", err)
		}
		return nil
	})
}

// With continuous batching (two rows in flight, newcomers joining, the live row decoded alone),
// every row records the experts it records generated alone, and replaying them reproduces its
// tokens.
func TestMoEContinuousRecord(t *testing.T) {
	m := randomModel(t, "qwen3_moe", 300, gotch.Double, 0.3, 5)
	p := charPolicy(t, m)
	p.StopIDs = nil
	ps, ss := continuousRows()
	recs := make([]Routes, len(ps))
	opts := make([]RowOptions, len(ps))
	for i := range opts {
		opts[i].Record = &recs[i]
	}
	p.MaxBatch = 2
	var got []llm.Completion
	events, _ := traced(t, func() {
		var err error
		if got, err = p.GenerateStream(context.Background(), ps, ss, opts); err != nil {
			t.Fatal(err)
		}
	})
	if count(events, "join") < 3 || count(events, "live") == 0 {
		t.Fatalf("layouts %v: rows did not join or decode alone", events)
	}
	p.MaxBatch = 0
	for i := range ps {
		var alone Routes
		out, err := p.GenerateStream(context.Background(), ps[i:i+1], ss[i:i+1], []RowOptions{{Record: &alone}})
		if err != nil {
			t.Fatal(err)
		}
		sameCompletion(t, i, out[0], got[i])
		if want := len(ps[i]) + len(got[i].ResponseIDs) - 1; recs[i].Tokens() != want || !slices.Equal(recs[i].IDs, alone.IDs) {
			t.Fatalf("row %d: %d tokens recorded in the continuous batch, %d alone (want %d); equal %v", i, recs[i].Tokens(), alone.Tokens(), want, slices.Equal(recs[i].IDs, alone.IDs))
		}
	}
	for i := range opts {
		opts[i] = RowOptions{Replay: &recs[i]}
	}
	p.MaxBatch = 2
	again, err := p.GenerateStream(context.Background(), ps, ss, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		sameCompletion(t, i, got[i], again[i])
	}
}

// Routes that are not the model's are refused naming what is wrong, and so are routes asked of a
// dense model; generation refuses them as bad requests.
func TestRoutesRefused(t *testing.T) {
	m := randomModel(t, "qwen3_moe", 48, gotch.Float, 0.2, 5)
	dense := randomModel(t, "qwen3", 48, gotch.Float, 0.2, 5)
	routes := func(ids ...int16) *Routes { return &Routes{Layers: 2, TopK: 2, IDs: ids} }
	seq := func(r *Routes) []Sequence {
		return []Sequence{{PromptIDs: []int{1, 2}, ResponseIDs: []int{3}, Routes: r}}
	}
	for _, tc := range []struct {
		m    *Model
		seqs []Sequence
		want string
	}{
		{m, seq(&Routes{Layers: 3, TopK: 2, IDs: make([]int16, 6)}), "3 layers"},
		{m, seq(routes(-1, -1, 0, 4)), "expert 4 outside"},
		{m, seq(routes(-1, -1, 1, 1)), "expert 1 twice"},
		{m, seq(routes(-1, -1, 0)), "not a whole number"},
		{m, seq(&Routes{From: 2, Layers: 2, TopK: 2, IDs: []int16{-1, -1, 0, 1, -1, -1, 0, 1}}), "tokens 2 – 3"},
		{dense, seq(routes(-1, -1, 0, 1)), "without mixture-of-experts"},
		{dense, []Sequence{{PromptIDs: []int{1}, ResponseIDs: []int{3}, Record: &Routes{}}}, "no mixture-of-experts"},
	} {
		onTorch(t, func() error {
			_, err := tc.m.Score(tc.seqs, false, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("%+v: %v, want an error containing %q", tc.seqs[0].Routes, err, tc.want)
			}
			return nil
		})
	}
	// routes covering the prompt (From 0) of a valid sequence are taken
	onTorch(t, func() error {
		_, err := m.Score(seq(routes(-1, -1, 0, 1, -1, -1, 3, 2)), false, 0)
		return err
	})
	p := &Policy{ID: "dense", Model: dense, Device: gotch.CPU}
	_, err := p.GenerateStream(context.Background(), [][]int{{1, 2}}, []llm.Sampling{{MaxNewTokens: 2}}, []RowOptions{{Record: &Routes{}}})
	if !errors.Is(err, llm.ErrBadRequest) {
		t.Fatalf("recording routes of a dense model: %v, want a bad request", err)
	}
}

// A Qwen3-MoE model saves as transformers writes it, in shards: one tensor per expert under its
// Hub name (mlp.experts.{j}.gate_proj …, the router mlp.gate), the index listing them, config.json
// with the mixture's keys; and loads back bit-exact.
func TestMoESaveSharded(t *testing.T) {
	m := randomModel(t, "qwen3_moe", 64, gotch.Float, 0.02, 4)
	dir := t.TempDir()
	onTorch(t, func() error {
		if err := m.SaveSharded(dir, 24<<10); err != nil {
			return err
		}
		return sameWeights(m, dir)
	})
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil || json.Unmarshal(data, &index) != nil {
		t.Fatalf("index: %v %s", err, data)
	}
	shards := map[string]bool{}
	for _, name := range []string{"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.0.gate_proj.weight",
		"model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.experts.2.up_proj.weight", "model.layers.0.mlp.up_proj.weight"} {
		if index.WeightMap[name] == "" {
			t.Errorf("the index lacks %s", name)
		}
		shards[index.WeightMap[name]] = true
	}
	if len(shards) < 2 || len(index.WeightMap) != len(m.slots()) {
		t.Errorf("%d tensors over %d shards, want %d tensors in several", len(index.WeightMap), len(shards), len(m.slots()))
	}
	var cfg map[string]any
	data, _ = os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["num_experts"] != 4.0 || cfg["num_experts_per_tok"] != 2.0 || cfg["moe_intermediate_size"] != 24.0 ||
		cfg["norm_topk_prob"] != true || fmt.Sprint(cfg["mlp_only_layers"]) != "[0]" || cfg["architectures"].([]any)[0] != "Qwen3MoeForCausalLM" {
		t.Errorf("config.json: %s", data)
	}
}

// A Qwen3-MoE folder drmas writes (sharded, as checkpoints and exports are) loads in a Hugging
// Face-style loader by key names — testdata/golden.py --check, which reads config.json and the
// shards the index lists into transformers' formulas in float64 — and gives drmas's logits within
// 1e-4, every token's experts and a greedy continuation equal. Skipped without a python3 with torch
// (Debian's python3-torch: /usr/bin/python3).
func TestMoECheckpointLoadsByKeyNames(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		t.Skipf("no %s with torch (apt install python3-torch): %v", py, err)
	}
	m := randomModel(t, "qwen3_moe", 64, gotch.Float, 0.3, 9)
	dir := t.TempDir()
	onTorch(t, func() error { return m.SaveSharded(dir, 24<<10) })
	ids := [][]int{{1, 5, 9, 17, 33, 2, 40, 7}, {3, 44, 3, 28, 19, 6, 0, 47}}
	const greedy = 6
	arg, _ := json.Marshal(ids)
	out, err := exec.Command(py, "testdata/golden.py", "--check", dir, string(arg), fmt.Sprint(greedy)).Output()
	if err != nil {
		t.Fatalf("golden.py --check: %v", err)
	}
	var ref struct {
		Logits [][][]float64
		Routes [][][][]int // [row][token][layer][k]
		Greedy []int
	}
	if err := json.Unmarshal(out, &ref); err != nil {
		t.Fatal(err)
	}
	var recs [2]Routes
	onTorch(t, func() error {
		got := values(m.Forward(idsTensor(ids...), nil, nil, nil))
		V, worst := m.Config.VocabSize, 0.0
		for b, row := range ref.Logits {
			for i, pos := range row {
				for v, want := range pos {
					worst = max(worst, math.Abs(got[(b*len(row)+i)*V+v]-want))
				}
			}
		}
		if worst > 1e-4 {
			return fmt.Errorf("logits differ from the key-name loader's by %.3g", worst)
		}
		t.Logf("max |Δ logit| against the loader by key names: %.2g", worst)
		_, err := m.Score([]Sequence{{PromptIDs: ids[0][:1], ResponseIDs: ids[0][1:], Record: &recs[0]},
			{PromptIDs: ids[1][:1], ResponseIDs: ids[1][1:], Record: &recs[1]}}, false, 0)
		return err
	})
	for b, rec := range recs {
		for i := range ref.Routes[b] {
			for l, want := range ref.Routes[b][i] {
				for k := range want {
					if got := int(rec.IDs[(i*rec.Layers+l)*rec.TopK+k]); got != want[k] {
						t.Fatalf("row %d token %d layer %d: expert %d, the loader's %v", b, i, l, got, want)
					}
				}
			}
		}
	}
	p := &Policy{ID: "moe", Model: m, Device: gotch.CPU}
	gen, err := p.GenerateIDs(context.Background(), [][]int{ids[0]}, []llm.Sampling{{MaxNewTokens: greedy}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gen[0].ResponseIDs, ref.Greedy) {
		t.Fatalf("greedy %v, the loader's %v", gen[0].ResponseIDs, ref.Greedy)
	}
}
