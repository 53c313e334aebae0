package train

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/torch"
)

// moeInit is a tiny float64 Qwen3-MoE for the tinyConfig team: two layers of 4 experts, top-2.
var moeInit = []string{"models.0.init={model_type: qwen3_moe, hidden_size: 16, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, " +
	"num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 8, norm_topk_prob: true, initializer_range: 0.2}",
	"models.0.dtype=float64", "warmup.steps=0", "algorithm.kl.coef=0"}

// Routing replay through the trainer: a float64 Qwen3-MoE team rolls out (every call carries the
// experts its tokens went to), then its router is perturbed so that every token's live top-2 changes
// in layer 1 while the gate weights of the experts the rollout used stay as they were (a cold expert
// made hot: norm_topk_prob renormalizes over the chosen experts only). With routing_replay: rollout
// the training pass's log-probs of the sampled calls equal the rollout-time pass's in float64 to
// 1e-9 and the generator's to float32 precision, and the step's mismatch is 0; with none they
// differ, and the mismatch is every token of layer 1. The metrics carry both.
func TestRoutingReplayTrainsWithTheRolloutsExperts(t *testing.T) {
	cfg := tinyConfig(t, t.TempDir(), moeInit...)
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ms := modelOf(tr, "small")
	if ms.moe == nil || !ms.moe.replay {
		t.Fatalf("routing %+v: want a mixture-of-experts model replaying (the default)", ms.moe)
	}
	param := func(name string) *ts.Tensor {
		for i, n := range ms.names {
			if n == name {
				return ms.params[i]
			}
		}
		t.Fatalf("no parameter %s", name)
		return nil
	}
	router, emb := param("model.layers.1.mlp.gate.weight"), param("model.embed_tokens.weight")
	set := func(x *ts.Tensor, rows []int64, col int64, v float64) {
		if err := torch.Do(func() error {
			return torch.NoGrad(func() error {
				s := torch.NewScope()
				defer s.Close()
				for _, r := range rows {
					x.MustNarrow(0, r, 1, false).MustNarrow(1, col, 1, true).MustFill_(ts.FloatScalar(v))
				}
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Hidden dimension 0 carries a large value on every token; experts 0–2 read it, expert 3 does not.
	all := make([]int64, emb.MustSize()[0])
	for i := range all {
		all[i] = int64(i)
	}
	set(emb, all, 0, 20)
	set(router, []int64{0, 1, 2}, 0, 2)
	set(router, []int64{3}, 0, 0)

	roll, _, err := tr.rollout(context.Background(), tr.Router, 1)
	if err != nil {
		t.Fatal(err)
	}
	var items []*item
	for _, tj := range roll.Trajectories {
		for _, c := range tj.Calls {
			if len(c.ResponseIDs) == 0 {
				continue
			}
			if n := len(c.PromptIDs) + len(c.ResponseIDs) - 1; c.Routes.Tokens() != n {
				t.Fatalf("call of %s: routes cover %d tokens, want %d (the prompt and response but the last)", c.Agent, c.Routes.Tokens(), n)
			}
			items = append(items, &item{agent: c.Agent, prompt: c.PromptIDs, response: c.ResponseIDs, served: c.LogProbs, routes: c.Routes, adv: 1})
		}
	}
	if len(items) < 4 {
		t.Fatalf("%d calls with a response: too few for the test", len(items))
	}
	checkRoutesKept(t, roll)
	scores := func() (lp []float64, st lossTerms) {
		err := torch.Do(func() error {
			s := torch.NewScope()
			defer s.Close()
			sc, _, err := ms.pol.Model.TrainScore(ms.moe.sequences(items), false, false)
			if err != nil {
				return err
			}
			lp = sc.LogProbs.MustTotype(gotch.Double, false).Float64Values(true)
			st.routes.stats.Add(sc.Routes)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return lp, st
	}
	rolloutTime, _ := scores()
	set(router, []int64{3}, 0, 4) // expert 3 now tops every token's router in layer 1

	width := len(rolloutTime) / len(items)
	compare := func(lp []float64) (vsPass, vsGenerator float64) {
		for i, x := range items {
			for j := range x.response {
				vsPass = math.Max(vsPass, math.Abs(lp[i*width+j]-rolloutTime[i*width+j]))
				vsGenerator = math.Max(vsGenerator, math.Abs(lp[i*width+j]-float64(x.served[j])))
			}
		}
		return vsPass, vsGenerator
	}
	for _, mode := range []string{algo.ReplayRollout, algo.ReplayNone} {
		ms.moe.replay = mode == algo.ReplayRollout
		lp, st := scores()
		vsPass, vsGen := compare(lp)
		tokens, used, live := st.routes.stats.Tokens[1], st.routes.stats.Used[1], st.routes.stats.Live[1]
		m := Metrics{}
		m.addRouting("small", ms.moe, st.routes)
		t.Logf("%s: |Δ log-prob| %.2g against the rollout-time pass, %.2g against the generator; layer 1: %d tokens, %d routed elsewhere, %d live top-2 moved",
			mode, vsPass, vsGen, tokens, used, live)
		if live != tokens || tokens == 0 {
			t.Fatalf("%s: the perturbation moved the live top-2 of %d of %d tokens, want all", mode, live, tokens)
		}
		if mode == algo.ReplayRollout {
			if vsPass > 1e-9 || vsGen > 1e-5 {
				t.Fatalf("replay: log-probs differ from the rollout's by %.3g (pass, float64) and %.3g (generator, float32)", vsPass, vsGen)
			}
			if used != 0 || m[metric.RoutingMismatchModel("small")] != 0 {
				t.Fatalf("replay: %d tokens routed elsewhere, mismatch %v; want 0", used, m[metric.RoutingMismatchModel("small")])
			}
		} else {
			if vsPass < 1e-3 {
				t.Fatalf("no replay: log-probs within %.3g of the rollout's: the perturbation changed nothing", vsPass)
			}
			if used != tokens || !(m[metric.RoutingMismatchModel("small")] > 0) {
				t.Fatalf("no replay: %d of %d tokens routed elsewhere, mismatch %v; want all, > 0", used, tokens, m[metric.RoutingMismatchModel("small")])
			}
		}
		if !(m[metric.RoutingDriftModel("small")] > 0) {
			t.Fatalf("%s: drift %v, want > 0", mode, m[metric.RoutingDriftModel("small")])
		}
	}
}

// checkRoutesKept: the transcripts carry each call's routes (SGLang's base64 int32, with their
// shape), and a pending rollout (gob, as rollout.Source.Pending writes it) keeps them.
func checkRoutesKept(t *testing.T, roll *env.Rollout) {
	t.Helper()
	var b bytes.Buffer
	if err := env.WriteTranscripts(&b, "train", roll, nil); err != nil {
		t.Fatal(err)
	}
	var calls []env.Call
	for _, tj := range roll.Trajectories {
		calls = append(calls, tj.Calls...)
	}
	dec := json.NewDecoder(&b)
	for i := 0; dec.More(); i++ {
		var line env.TranscriptLine
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		want := calls[i].Routes
		got, err := llm.RoutesFromBase64(line.RoutedExperts, want.Layers, want.TopK)
		if err != nil || !slices.Equal(got.IDs, want.IDs) || !slices.Equal(line.RoutedExpertsShape, []int{want.Tokens(), want.Layers, want.TopK}) {
			t.Fatalf("transcript line %d: routed experts %q %v (%v), want the call's %d tokens", i, line.RoutedExperts[:min(len(line.RoutedExperts), 40)], line.RoutedExpertsShape, err, want.Tokens())
		}
	}
	var g bytes.Buffer
	if err := gob.NewEncoder(&g).Encode(roll); err != nil {
		t.Fatal(err)
	}
	var back env.Rollout
	if err := gob.NewDecoder(&g).Decode(&back); err != nil {
		t.Fatal(err)
	}
	if r, w := back.Trajectories[0].Calls[0].Routes, roll.Trajectories[0].Calls[0].Routes; r == nil || !slices.Equal(r.IDs, w.IDs) {
		t.Fatalf("a rollout through gob lost its routes")
	}
}
