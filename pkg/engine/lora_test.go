package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
	"github.com/drmas/drmas/pkg/serve"
	"github.com/drmas/drmas/pkg/torch"
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
		"a": policytest.Adapter(t, p.Model.Base(), filepath.Join(root, "a"), "a", policy.LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{arch.LoRAAllLinear}}, 1, 0.8),
		"b": policytest.Adapter(t, p.Model.Base(), filepath.Join(root, "b"), "b", policy.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{"q_proj", "v_proj", "down_proj"}}, 2, 1.5),
	}
	outside := t.TempDir()
	policytest.Adapter(t, p.Model.Base(), outside, "x", policy.LoRAConfig{Rank: 1, Alpha: 1, Targets: []string{"q_proj"}}, 3, 1)
	const key = "lora-key"
	srvURL := startServe(t, p, serve.Options{Name: "toy-base", APIKey: key, WeightUpdates: true, WeightsRoot: root, Window: 50 * time.Millisecond, MaxLoRAs: 4})

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
			var err error
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
			c, err := engine.New(context.Background(), "toy", engine.Config{Engine: kind, URLs: []string{srvURL}, MaxInflight: 16,
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
			routed := llm.Version{Step: 7, Adapter: name("b"), Known: true}
			c.Route("solver", routed)
			if got, err := c.Generate(context.Background(), solver); err != nil || !slices.Equal(got[0].ResponseIDs, ref[0].ResponseIDs) {
				t.Errorf("routed to %s: %v %v, policy API %v", name("b"), got, err, ref[0].ResponseIDs)
			} else if got[0].Version != routed {
				t.Errorf("a routed completion reports version %+v, want the route's %+v", got[0].Version, routed)
			}
			baseRef, err := p.GenerateIDs(context.Background(), [][]int{ids}, []llm.Sampling{{MaxNewTokens: maxNew}})
			if err != nil {
				t.Fatal(err)
			}
			if slices.Equal(baseRef[0].ResponseIDs, ref[0].ResponseIDs) {
				t.Fatal("adapter b generates what the base generates on the chat prompt: the route test proves nothing")
			}
			c.Route("solver", llm.Version{})
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

// A replica that restarts after the frozen base was synced (once) loses the base's weights and its
// adapters: it fails the next adapter load and leaves rotation (or, restarted silently between two
// loads, Verify finds it serving another weights version). Rejoin reloads the synced base and every
// current adapter on it, and it serves them again: what it generates on each adapter is the policy
// API's (a restart started it from other weights, so without the reload it would differ).
func TestRejoinReloadsBaseAndAdapters(t *testing.T) {
	p := policytest.Load(t, toyDir)
	root := t.TempDir()
	baseDir := filepath.Join(root, "base", "v0")
	if err := torch.Do(func() error { return p.Save(baseDir) }); err != nil {
		t.Fatal(err)
	}
	a := policytest.Adapter(t, p.Model.Base(), filepath.Join(root, "a"), "a", policy.LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{arch.LoRAAllLinear, "lm_head"}}, 1, 0.8)
	apol, err := policy.NewAdapterPolicy("ref-a", p, a)
	if err != nil {
		t.Fatal(err)
	}
	prompts := [][]int{{60, 97, 110, 100}, {72, 101, 108, 108, 111, 33}}
	const maxNew = 8
	sampling := []llm.Sampling{{MaxNewTokens: maxNew}, {MaxNewTokens: maxNew}}
	want := func(pol *policy.Policy) [][]int {
		out, err := pol.GenerateIDs(context.Background(), prompts, sampling)
		if err != nil {
			t.Fatal(err)
		}
		return [][]int{out[0].ResponseIDs, out[1].ResponseIDs}
	}
	wantA, wantBase := want(apol), want(p)
	// A policy of the toy's shape with other (random) weights: what a restarted replica serves (a
	// new one each time: a server reloads weights into its policy).
	other := func() *policy.Policy {
		var o *policy.Policy
		if err := torch.Do(func() error {
			m, err := policy.NewRandom(p.Model.Config, gotch.CPU, gotch.Float, 99)
			if err != nil {
				return err
			}
			o, err = policy.NewPolicy("toy", m, p.Tok, p.Chat)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return o
	}
	start := func(pol *policy.Policy) string {
		return startServe(t, pol, serve.Options{Name: "toy-base", WeightUpdates: true, WeightsRoot: root, Window: 20 * time.Millisecond, MaxLoRAs: 4})
	}
	codec := engine.Codec{Prompt: p.EncodePromptWith, Tok: p.Tok, StopIDs: p.StopIDs}
	for _, kind := range []string{engine.VLLM, engine.SGLang} {
		t.Run(kind, func(t *testing.T) {
			// Replica b sits behind a switch: down (503) or forwarding to its current server.
			var target atomic.Pointer[url.URL]
			var down atomic.Bool
			proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if down.Load() {
					http.Error(w, "restarting", http.StatusServiceUnavailable)
					return
				}
				httputil.NewSingleHostReverseProxy(target.Load()).ServeHTTP(w, r)
			}))
			t.Cleanup(proxy.Close)
			setTarget := func(u string) {
				parsed, err := url.Parse(u)
				if err != nil {
					t.Fatal(err)
				}
				target.Store(parsed)
			}
			setTarget(start(policytest.Load(t, toyDir)))
			urlA := start(policytest.Load(t, toyDir))
			cfg := engine.Config{Engine: kind, URLs: []string{urlA, proxy.URL}, MaxInflight: 8, Timeout: 30 * time.Second, Retries: 1}
			c, err := engine.New(context.Background(), "toy", cfg, codec)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := c.Sync(ctx, baseDir, llm.StepVersion(0)); err != nil {
				t.Fatal(err)
			}
			if err := c.LoadAdapter(ctx, "a@1", filepath.Join(root, "a")); err != nil {
				t.Fatal(err)
			}
			down.Store(true)
			if err := c.LoadAdapter(ctx, "a@2", filepath.Join(root, "a")); err != nil {
				t.Fatal(err)
			}
			if v := c.Versions(); v[proxy.URL].String() != "" || v[urlA].String() != "v0" {
				t.Fatalf("after the failed load: versions %v, want %s out of rotation", v, proxy.URL)
			}
			// The restart: another server, from other weights, with no adapters.
			setTarget(start(other()))
			down.Store(false)
			onlyB, err := engine.New(ctx, "toy", engine.Config{Engine: kind, URLs: []string{proxy.URL}, MaxInflight: 8, Timeout: 30 * time.Second, Retries: 1}, codec)
			if err != nil {
				t.Fatal(err)
			}
			gen := func(adapter string) ([][]int, error) {
				out, err := onlyB.GenerateAdapterIDs(ctx, prompts, sampling, []string{adapter, adapter})
				if err != nil {
					return nil, err
				}
				return [][]int{out[0].ResponseIDs, out[1].ResponseIDs}, nil
			}
			if got, err := gen(""); err != nil || slices.EqualFunc(got, wantBase, slices.Equal) {
				t.Fatalf("the restarted replica generates the base's %v (err %v): the test proves nothing", got, err)
			}
			if n := c.Rejoin(ctx, baseDir, llm.StepVersion(0)); n != 1 {
				t.Fatalf("Rejoin brought back %d replicas, want 1", n)
			}
			if v := c.Versions(); v[proxy.URL].String() != "v0" {
				t.Fatalf("after Rejoin: versions %v", v)
			}
			for _, name := range []string{"a@1", "a@2"} {
				if got, err := gen(name); err != nil || !slices.EqualFunc(got, wantA, slices.Equal) {
					t.Errorf("rejoined replica on %s: %v (err %v), the policy API gives %v", name, got, err, wantA)
				}
			}
			if got, err := gen(""); err != nil || !slices.EqualFunc(got, wantBase, slices.Equal) {
				t.Errorf("rejoined replica on the base: %v (err %v), want %v", got, err, wantBase)
			}
			if n := c.Rejoin(ctx, baseDir, llm.StepVersion(0)); n != 0 {
				t.Errorf("a second Rejoin brought back %d replicas, want 0 (none out)", n)
			}
			// A silent restart: between two syncs, b comes back on other weights without failing
			// anything. Verify sees the weights version it reports and takes it out; Rejoin reloads it.
			setTarget(start(other()))
			if n := c.Verify(ctx, llm.StepVersion(0)); n != 1 {
				t.Fatalf("Verify after a silent restart took out %d replicas, want 1", n)
			}
			if v := c.Versions(); v[proxy.URL].String() != "" || v[urlA].String() != "v0" {
				t.Fatalf("after Verify: versions %v, want %s out", v, proxy.URL)
			}
			if n := c.Rejoin(ctx, baseDir, llm.StepVersion(0)); n != 1 {
				t.Fatalf("Rejoin after a silent restart brought back %d replicas, want 1", n)
			}
			if got, err := gen("a@2"); err != nil || !slices.EqualFunc(got, wantA, slices.Equal) {
				t.Errorf("rejoined replica after a silent restart, on a@2: %v (err %v), the policy API gives %v", got, err, wantA)
			}
			if n := c.Verify(ctx, llm.StepVersion(0)); n != 0 {
				t.Errorf("Verify with every replica on v0 took out %d", n)
			}
		})
	}
}

// startServe runs drmas serve on pol (the toy's folder) on a loopback port until the test ends and
// returns its URL.
func startServe(t *testing.T, pol *policy.Policy, opts serve.Options) string {
	t.Helper()
	srv, err := serve.New(pol, toyDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe(ctx, "127.0.0.1:0", func(a net.Addr) { addr <- a }) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + (<-addr).String()
}
