package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
	"github.com/drmas/drmas/pkg/serve"
)

const toyDir = "../policy/testdata/toy"

// The engine client loads adapter folders on a `drmas serve` replica by name (vLLM's and SGLang's
// endpoints), generates with a per-request adapter (vLLM: model; SGLang: lora_path) in one burst
// mixing adapters and the base, and gets exactly what the policy API generates on each; refusals
// are errors that leave the replica in rotation; an unloaded adapter is refused.
func TestClientLoRAAdaptersOnServe(t *testing.T) {
	p := policytest.Load(t, toyDir)
	root := t.TempDir()
	ads := map[string]*policy.Adapter{
		"a": policytest.Adapter(t, p.Model.Base(), filepath.Join(root, "a"), "a", policy.LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{policy.AllLinear}}, 1, 0.8),
		"b": policytest.Adapter(t, p.Model.Base(), filepath.Join(root, "b"), "b", policy.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{"q_proj", "v_proj", "down_proj"}}, 2, 1.5),
	}
	outside := t.TempDir()
	policytest.Adapter(t, p.Model.Base(), outside, "x", policy.LoRAConfig{Rank: 1, Alpha: 1, Targets: []string{"q_proj"}}, 3, 1)
	const key = "lora-key"
	srv, err := serve.New(p, toyDir, serve.Options{Name: "toy-base", APIKey: key, WeightUpdates: true, WeightsRoot: root, Window: 50 * time.Millisecond, MaxLoRAs: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe(ctx, "127.0.0.1:0", func(a net.Addr) { addr <- a }) }()
	url := "http://" + (<-addr).String()
	t.Cleanup(func() { cancel(); <-done })

	codec := engine.Codec{Prompt: p.EncodePromptWith, Tok: p.Tok, StopIDs: p.StopIDs}
	prompts := [][]int{{60, 97, 110, 100}, {72, 101, 108, 108, 111, 33}, {50, 43, 50, 61}}
	const maxNew = 10
	// What the policy API generates: ids and log-probs per adapter ("" = base) and prompt.
	type gen struct {
		ids []int
		lps []float32
	}
	want := map[string][]gen{}
	for _, name := range []string{"a", "b", ""} {
		pol := p
		if name != "" {
			if pol, err = policy.NewAdapterPolicy("ref-"+name, p, ads[name]); err != nil {
				t.Fatal(err)
			}
		}
		for _, pr := range prompts {
			out, err := pol.GenerateIDs(context.Background(), [][]int{pr}, []llm.Sampling{{MaxNewTokens: maxNew}})
			if err != nil {
				t.Fatal(err)
			}
			want[name] = append(want[name], gen{out[0].ResponseIDs, out[0].LogProbs})
		}
	}
	if slices.EqualFunc(want["a"], want[""], func(x, y gen) bool { return slices.Equal(x.ids, y.ids) }) {
		t.Fatal("adapter a generates what the base generates: the test proves nothing")
	}

	for _, kind := range []string{engine.VLLM, engine.SGLang} {
		t.Run(kind, func(t *testing.T) {
			c, err := engine.New(context.Background(), "toy", engine.Config{Engine: kind, URLs: []string{url}, MaxInflight: 16,
				Timeout: 30 * time.Second, Retries: 1, APIKey: key}, codec)
			if err != nil {
				t.Fatal(err)
			}
			name := func(ad string) string { return fmt.Sprintf("%s-%s@1", kind, ad) }
			for _, ad := range []string{"a", "b"} {
				if err := c.LoadAdapter(context.Background(), name(ad), filepath.Join(root, ad)); err != nil {
					t.Fatal(err)
				}
			}
			if got := c.Adapters(); !slices.Equal(got, []string{name("a"), name("b")}) {
				t.Errorf("Adapters() = %v", got)
			}
			// One burst: every prompt on a, b and the base.
			var ps [][]int
			var settings []llm.Sampling
			var adapters, which []string
			for _, ad := range []string{"a", "b", ""} {
				for _, pr := range prompts {
					ps, settings = append(ps, pr), append(settings, llm.Sampling{MaxNewTokens: maxNew})
					which = append(which, ad)
					if ad == "" {
						adapters = append(adapters, "")
					} else {
						adapters = append(adapters, name(ad))
					}
				}
			}
			out, err := c.GenerateAdapterIDs(context.Background(), ps, settings, adapters)
			if err != nil {
				t.Fatal(err)
			}
			for i, comp := range out {
				w := want[which[i]][i%len(prompts)]
				if !slices.Equal(comp.ResponseIDs, w.ids) {
					t.Errorf("adapter %q prompt %v: engine %v, policy API %v", which[i], ps[i], comp.ResponseIDs, w.ids)
					continue
				}
				for j := range w.lps {
					if d := math.Abs(float64(comp.LogProbs[j] - w.lps[j])); d > 1e-4 {
						t.Errorf("adapter %q prompt %v token %d: log-prob %g, policy API %g", which[i], ps[i], j, comp.LogProbs[j], w.lps[j])
						break
					}
				}
			}
			// Generate: a request whose Model is a loaded adapter runs on it.
			msgs := []llm.Message{{Role: "user", Content: "hi"}}
			ids, err := p.EncodePromptWith(msgs, nil)
			if err != nil {
				t.Fatal(err)
			}
			bpol, _ := policy.NewAdapterPolicy("ref-b", p, ads["b"])
			ref, err := bpol.GenerateIDs(context.Background(), [][]int{ids}, []llm.Sampling{{MaxNewTokens: maxNew}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Generate(context.Background(), []llm.Request{{Model: name("b"), Agent: "x", Messages: msgs, Sampling: llm.Sampling{MaxNewTokens: maxNew}}})
			if err != nil || !slices.Equal(got[0].ResponseIDs, ref[0].ResponseIDs) {
				t.Errorf("Generate with model %s: %v %v, policy API %v", name("b"), got, err, ref[0].ResponseIDs)
			}

			// Route: requests for model "solver" run on the adapter it points at, switching versions.
			solver := []llm.Request{{Model: "solver", Agent: "x", Messages: msgs, Sampling: llm.Sampling{MaxNewTokens: maxNew}}}
			c.Route("solver", name("b"))
			if got, err := c.Generate(context.Background(), solver); err != nil || !slices.Equal(got[0].ResponseIDs, ref[0].ResponseIDs) {
				t.Errorf("routed to %s: %v %v, policy API %v", name("b"), got, err, ref[0].ResponseIDs)
			}
			baseRef, err := p.GenerateIDs(context.Background(), [][]int{ids}, []llm.Sampling{{MaxNewTokens: maxNew}})
			if err != nil {
				t.Fatal(err)
			}
			if slices.Equal(baseRef[0].ResponseIDs, ref[0].ResponseIDs) {
				t.Fatal("adapter b generates what the base generates on the chat prompt: the route test proves nothing")
			}
			c.Route("solver", "")
			if got, err := c.Generate(context.Background(), solver); err != nil || !slices.Equal(got[0].ResponseIDs, baseRef[0].ResponseIDs) {
				t.Errorf("route ended: %v %v, the base gives %v", got, err, baseRef[0].ResponseIDs)
			}

			// Refusals: a name taken, a folder outside the server's weights root. The replica stays.
			if err := c.LoadAdapter(context.Background(), name("a"), filepath.Join(root, "b")); err == nil || errors.Is(err, engine.ErrUnavailable) {
				t.Errorf("loading a taken name: %v (want a refusal, not unavailability)", err)
			}
			if err := c.LoadAdapter(context.Background(), name("x"), outside); err == nil || !strings.Contains(err.Error(), "weights root") {
				t.Errorf("loading from outside the weights root: %v", err)
			}
			if _, err := c.GenerateAdapterIDs(context.Background(), ps[:1], settings[:1], adapters[:1]); err != nil {
				t.Errorf("after refused loads the replica no longer serves: %v", err)
			}

			// Unloaded, an adapter is refused at once (a 4xx: not retried as unavailability).
			if err := c.UnloadAdapter(context.Background(), name("a")); err != nil {
				t.Fatal(err)
			}
			if got := c.Adapters(); !slices.Equal(got, []string{name("b")}) {
				t.Errorf("Adapters() after unload = %v", got)
			}
			if _, err := c.GenerateAdapterIDs(context.Background(), ps[:1], settings[:1], []string{name("a")}); err == nil || errors.Is(err, engine.ErrUnavailable) {
				t.Errorf("generating on an unloaded adapter: %v (want a refusal)", err)
			}
			if err := c.UnloadAdapter(context.Background(), name("a")); err == nil {
				t.Error("unloading an adapter twice gave no error")
			}
			if err := c.UnloadAdapter(context.Background(), name("b")); err != nil {
				t.Fatal(err)
			}
		})
	}
}
