package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
)

// raw posts body to url and returns the status and the body as text.
func raw(t *testing.T, url string, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

var loraPrompts = [][]int{{60, 97, 110, 100}, {72, 101, 108, 108, 111, 33}, {50, 43, 50, 61}}

const loraMaxNew = 10

// loraServer serves the toy model with weight updates allowed under a fresh root holding adapter
// folders a (rank 4, every projection) and b (rank 2, three of them), and the adapters.
func loraServer(t *testing.T, opt Options) (*Server, string, string, map[string]*policy.Adapter) {
	t.Helper()
	root := t.TempDir()
	opt.WeightUpdates, opt.WeightsRoot = true, root
	if opt.Window == 0 {
		opt.Window = 200 * time.Millisecond
	}
	s, hs := toyServer(t, opt)
	ads := map[string]*policy.Adapter{
		"a": policytest.Adapter(t, s.pol.Model.Base(), filepath.Join(root, "a"), "a", policy.LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{arch.LoRAAllLinear}}, 1, 0.8),
		"b": policytest.Adapter(t, s.pol.Model.Base(), filepath.Join(root, "b"), "b", policy.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{"q_proj", "v_proj", "down_proj"}}, 2, 1.5),
	}
	return s, hs.URL, root, ads
}

// completionIDs asks /v1/completions for the greedy ids of prompt on model.
func completionIDs(t *testing.T, url, model string, prompt []int) []int {
	t.Helper()
	code, rep := call(t, url+"/v1/completions", "", map[string]any{"model": model, "prompt": prompt, "max_tokens": loraMaxNew,
		"temperature": 0, "return_token_ids": true})
	if code != 200 {
		t.Fatalf("completions on %q: HTTP %d %v", model, code, rep)
	}
	return anyInts(t, rep["choices"].([]any)[0].(map[string]any)["token_ids"])
}

// generateIDs asks SGLang's /generate for the greedy ids of prompt on adapter lora ("" = base).
func generateIDs(t *testing.T, url, lora string, prompt []int) []int {
	t.Helper()
	body := map[string]any{"input_ids": prompt, "sampling_params": map[string]any{"max_new_tokens": loraMaxNew, "temperature": 0}}
	if lora != "" {
		body["lora_path"] = lora
	}
	code, rep := call(t, url+"/generate", "", body)
	if code != 200 {
		t.Fatalf("generate on %q: HTTP %d %v", lora, code, rep)
	}
	return anyInts(t, rep["output_ids"])
}

func anyInts(t *testing.T, v any) []int {
	t.Helper()
	list, ok := v.([]any)
	if !ok {
		t.Fatalf("%v: not a list of ids", v)
	}
	out := make([]int, len(list))
	for i, x := range list {
		out[i] = int(x.(float64))
	}
	return out
}

// policyIDs is what the policy API generates for prompt on adapter a (nil: the base).
func policyIDs(t *testing.T, base *policy.Policy, a *policy.Adapter, prompt []int) []int {
	t.Helper()
	p := base
	if a != nil {
		var err error
		if p, err = policy.NewAdapterPolicy("ref-"+a.Name, base, a); err != nil {
			t.Fatal(err)
		}
	}
	out, err := p.GenerateIDs(context.Background(), [][]int{prompt}, []llm.Sampling{{MaxNewTokens: loraMaxNew}})
	if err != nil {
		t.Fatal(err)
	}
	return out[0].ResponseIDs
}

// Two adapters loaded at run time (one through vLLM's endpoint, one through SGLang's) serve
// requests that name them; a concurrent burst on a, b and the base shares batches and gives each
// request exactly the greedy ids it gets alone, which are the policy API's.
func TestLoRAServesAdaptersInMixedBatches(t *testing.T) {
	s, url, root, ads := loraServer(t, Options{MaxBatch: 32})
	if code, body := raw(t, url+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name":"a","lora_path":%q}`, filepath.Join(root, "a"))); code != 200 || body != "Success: LoRA adapter 'a' added successfully." {
		t.Fatalf("vLLM load: HTTP %d %q", code, body)
	}
	code, rep := call(t, url+"/load_lora_adapter", "", map[string]any{"lora_name": "b", "lora_path": filepath.Join(root, "b")})
	if code != 200 || rep["success"] != true || len(rep["loaded_adapters"].(map[string]any)) != 2 {
		t.Fatalf("SGLang load: HTTP %d %v", code, rep)
	}

	code, rep = call(t, url+"/v1/models", "", nil)
	if code != 200 {
		t.Fatalf("models: %d %v", code, rep)
	}
	var listed []string
	for _, m := range rep["data"].([]any) {
		mm := m.(map[string]any)
		listed = append(listed, fmt.Sprintf("%v<%v", mm["id"], mm["parent"]))
	}
	if want := []string{toyDir + "<<nil>", "a<" + toyDir, "b<" + toyDir}; !slices.Equal(listed, want) {
		t.Errorf("/v1/models lists %v, want %v", listed, want)
	}
	if code, rep := call(t, url+"/v1/models/b", "", nil); code != 200 || rep["parent"] != toyDir || rep["root"] != filepath.Join(root, "b") {
		t.Errorf("/v1/models/b: %d %v", code, rep)
	}

	models := []string{"a", "b", ""}
	alone := map[string][][]int{}
	for _, m := range models {
		for _, pr := range loraPrompts {
			got := completionIDs(t, url, m, pr)
			var a *policy.Adapter
			if m != "" {
				a = ads[m]
			}
			if want := policyIDs(t, s.pol, a, pr); !slices.Equal(got, want) {
				t.Errorf("model %q prompt %v: served %v, policy API %v", m, pr, got, want)
			}
			if sg := generateIDs(t, url, m, pr); !slices.Equal(sg, got) {
				t.Errorf("model %q prompt %v: /generate %v, /v1/completions %v", m, pr, sg, got)
			}
			alone[m] = append(alone[m], got)
		}
	}
	for _, m := range []string{"a", "b"} {
		if slices.EqualFunc(alone[m], alone[""], slices.Equal) {
			t.Fatalf("adapter %s generates what the base generates on every prompt: the test proves nothing", m)
		}
	}

	before := s.batches.Load()
	type ask struct {
		model  string
		prompt int
		sgl    bool
	}
	var asks []ask
	for _, m := range models {
		for i := range loraPrompts {
			asks = append(asks, ask{m, i, false}, ask{m, i, true})
		}
	}
	got := make([][]int, len(asks))
	var wg sync.WaitGroup
	for k, q := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if q.sgl {
				got[k] = generateIDs(t, url, q.model, loraPrompts[q.prompt])
			} else {
				got[k] = completionIDs(t, url, q.model, loraPrompts[q.prompt])
			}
		}()
	}
	wg.Wait()
	if n := s.batches.Load() - before; n > 5 { // typically 1; leeway for a loaded machine
		t.Errorf("%d concurrent requests on 2 adapters and the base took %d batches: not batched together", len(asks), n)
	}
	for k, q := range asks {
		if want := alone[q.model][q.prompt]; !slices.Equal(got[k], want) {
			t.Errorf("burst: model %q prompt %d (sglang %v): %v, alone %v", q.model, q.prompt, q.sgl, got[k], want)
		}
	}

	// Unloaded, an adapter is gone for new requests; the other still serves.
	if code, body := raw(t, url+"/v1/unload_lora_adapter", `{"lora_name":"a"}`); code != 200 || body != "Success: LoRA adapter 'a' removed successfully." {
		t.Fatalf("vLLM unload: HTTP %d %q", code, body)
	}
	if code, rep := call(t, url+"/v1/completions", "", map[string]any{"model": "a", "prompt": loraPrompts[0], "max_tokens": 2}); code != 404 ||
		!strings.Contains(fmt.Sprint(rep), `"b"`) {
		t.Errorf("completion on an unloaded adapter: HTTP %d %v (want 404 naming what is served)", code, rep)
	}
	if got := completionIDs(t, url, "b", loraPrompts[1]); !slices.Equal(got, alone["b"][1]) {
		t.Errorf("b after a's unload: %v, want %v", got, alone["b"][1])
	}
	if names := s.pol.AdapterNames(); len(names) != 1 || !strings.HasPrefix(names[0], "b#") {
		t.Errorf("the policy holds adapters %v after a's unload, want b's only", names)
	}
}

// Load and unload refusals are clear, in each protocol's shape: unknown names, paths outside the
// weights root, folders that are no adapter, one adapter too many, a name taken, endpoints off.
func TestLoRALoadErrors(t *testing.T) {
	s, url, root, _ := loraServer(t, Options{MaxLoRAs: 1})
	outside := t.TempDir()
	policytest.Adapter(t, s.pol.Model.Base(), outside, "x", policy.LoRAConfig{Rank: 1, Alpha: 1, Targets: []string{"q_proj"}}, 3, 1)
	empty := filepath.Join(root, "empty")
	os.Mkdir(empty, 0o755)
	broken := filepath.Join(root, "broken")
	os.Mkdir(broken, 0o755)
	os.WriteFile(filepath.Join(broken, policy.AdapterConfigFile), []byte(`{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": true}`), 0o644)

	type want struct {
		status int
		says   string
	}
	vllm := func(path, body string, w want) {
		t.Helper()
		code, rep := call(t, url+path, "", jsonBody(body))
		msg := fmt.Sprint(rep["error"])
		if code != w.status || !strings.Contains(msg, w.says) {
			t.Errorf("vLLM %s %s: HTTP %d %v; want %d saying %q", path, body, code, rep, w.status, w.says)
		}
	}
	sglang := func(path, body string, w want) {
		t.Helper()
		code, rep := call(t, url+path, "", jsonBody(body))
		if code != w.status || rep["success"] != false || !strings.Contains(fmt.Sprint(rep["error_message"]), w.says) {
			t.Errorf("SGLang %s %s: HTTP %d %v; want %d, success false, saying %q", path, body, code, rep, w.status, w.says)
		}
	}
	for _, p := range []struct {
		fn   func(string, string, want)
		load string
	}{{vllm, "/v1/load_lora_adapter"}, {sglang, "/load_lora_adapter"}} {
		p.fn(p.load, `{"lora_name":"x"}`, want{400, "must be provided"})
		p.fn(p.load, fmt.Sprintf(`{"lora_name":"x","lora_path":%q}`, outside), want{403, "weights root"})
		p.fn(p.load, fmt.Sprintf(`{"lora_name":"x","lora_path":%q}`, filepath.Join(root, "missing")), want{400, "no such folder"})
		p.fn(p.load, fmt.Sprintf(`{"lora_name":"x","lora_path":%q}`, empty), want{400, "not a PEFT adapter folder"})
		p.fn(p.load, fmt.Sprintf(`{"lora_name":"x","lora_path":%q}`, broken), want{400, "use_dora"})
		p.fn(p.load, fmt.Sprintf(`{"lora_name":%q,"lora_path":%q}`, toyDir, filepath.Join(root, "a")), want{400, "base model's name"})
	}
	vllm("/v1/unload_lora_adapter", `{"lora_name":"nope"}`, want{404, "cannot be found"})
	sglang("/unload_lora_adapter", `{"lora_name":"nope"}`, want{404, "cannot be found"})
	vllm("/v1/unload_lora_adapter", `{}`, want{400, "needs to be provided"})

	if code, body := raw(t, url+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name":"a","lora_path":%q}`, filepath.Join(root, "a"))); code != 200 {
		t.Fatalf("load a: HTTP %d %s", code, body)
	}
	vllm("/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name":"a","lora_path":%q}`, filepath.Join(root, "b")), want{400, "already been loaded"})
	sglang("/load_lora_adapter", fmt.Sprintf(`{"lora_name":"b","lora_path":%q}`, filepath.Join(root, "b")), want{400, "--max-loras 1"})
	if code, rep := call(t, url+"/generate", "", map[string]any{"input_ids": loraPrompts[0], "lora_path": "b"}); code != 400 || !strings.Contains(fmt.Sprint(rep), "load_lora_adapter") {
		t.Errorf("/generate on an adapter not loaded: HTTP %d %v", code, rep)
	}
	if code, rep := call(t, url+"/generate", "", map[string]any{"input_ids": loraPrompts[0], "lora_path": []string{"a", "a"}}); code != 400 || !strings.Contains(fmt.Sprint(rep), "one prompt") {
		t.Errorf("/generate with a list of two adapters: HTTP %d %v", code, rep)
	}
	if code, rep := call(t, url+"/v1/models/nope", "", nil); code != 404 || !strings.Contains(fmt.Sprint(rep), `"a"`) {
		t.Errorf("/v1/models/nope: HTTP %d %v", code, rep)
	}

	_, off := toyServer(t, Options{})
	for _, path := range []string{"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/load_lora_adapter", "/unload_lora_adapter"} {
		if code, rep := call(t, off.URL+path, "", map[string]any{"lora_name": "a", "lora_path": filepath.Join(root, "a")}); code != 403 || !strings.Contains(fmt.Sprint(rep), "--enable-weight-updates") {
			t.Errorf("%s on a server without weight updates: HTTP %d %v", path, code, rep)
		}
	}
}

func jsonBody(s string) any { return rawJSON(s) }

// rawJSON marshals as itself.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// An adapter unloaded (or replaced in place) while a generation holds it stays alive until that
// generation ends: new requests no longer see the name, the held one still generates on the old
// tensors, and the last release frees them. Start-up adapters (Options.LoRAs) load like the others.
func TestLoRAUnloadWhileInUse(t *testing.T) {
	root := t.TempDir()
	p := policytest.Load(t, toyDir)
	a := policytest.Adapter(t, p.Model.Base(), filepath.Join(root, "a"), "a", policy.LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{arch.LoRAAllLinear}}, 1, 0.8)
	b := policytest.Adapter(t, p.Model.Base(), filepath.Join(root, "b"), "b", policy.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{"q_proj", "v_proj", "down_proj"}}, 2, 1.5)
	if _, err := New(p, toyDir, Options{LoRAs: []LoRA{{"a", filepath.Join(root, "a")}, {"b", filepath.Join(root, "b")}}, MaxLoRAs: 1}); err == nil ||
		!strings.Contains(err.Error(), "max-loras") {
		t.Errorf("two start-up adapters over --max-loras 1: %v", err)
	}
	if _, err := New(p, toyDir, Options{LoRAs: []LoRA{{"a", root}}}); err == nil || !strings.Contains(err.Error(), "--lora a=") {
		t.Errorf("a start-up adapter that is no adapter folder: %v", err)
	}
	s, err := New(p, toyDir, Options{LoRAs: []LoRA{{"a", filepath.Join(root, "a")}}, WeightUpdates: true, WeightsRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.run(ctx); close(done) }()
	hs := httptest.NewServer(s.Handler())
	defer func() { hs.Close(); cancel(); <-done }()

	wantA := policyIDs(t, p, a, loraPrompts[0])
	if got := completionIDs(t, hs.URL, "a", loraPrompts[0]); !slices.Equal(got, wantA) {
		t.Fatalf("start-up adapter a: %v, policy API %v", got, wantA)
	}
	held, err := s.useModel("a") // as a running generation holds it
	if err != nil {
		t.Fatal(err)
	}
	if code, body := raw(t, hs.URL+"/v1/unload_lora_adapter", `{"lora_name":"a"}`); code != 200 {
		t.Fatalf("unload: HTTP %d %s", code, body)
	}
	if code, _ := call(t, hs.URL+"/v1/completions", "", map[string]any{"model": "a", "prompt": loraPrompts[0]}); code != 404 {
		t.Errorf("a request for an unloaded adapter: HTTP %d, want 404", code)
	}
	if p.LookupAdapter(held.key) == nil {
		t.Fatal("an adapter a generation still holds was freed at unload")
	}
	got, err := p.GenerateStream(context.Background(), [][]int{loraPrompts[0]}, []llm.Sampling{{MaxNewTokens: loraMaxNew}}, []policy.RowOptions{{Adapter: held.key}})
	if err != nil || !slices.Equal(got[0].ResponseIDs, wantA) {
		t.Errorf("generation on the held adapter after unload: %v %v, want %v", got, err, wantA)
	}
	s.releaseLoRA(held)
	if p.LookupAdapter(held.key) != nil {
		t.Error("the last release of an unloaded adapter did not free it")
	}

	// load_inplace replaces a name: the held old tensors live on until released.
	if code, body := raw(t, hs.URL+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name":"x","lora_path":%q}`, filepath.Join(root, "a"))); code != 200 {
		t.Fatalf("load x: HTTP %d %s", code, body)
	}
	old, _ := s.useModel("x")
	if code, body := raw(t, hs.URL+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name":"x","lora_path":%q,"load_inplace":true}`, filepath.Join(root, "b"))); code != 200 {
		t.Fatalf("load_inplace x: HTTP %d %s", code, body)
	}
	if got, want := completionIDs(t, hs.URL, "x", loraPrompts[1]), policyIDs(t, p, b, loraPrompts[1]); !slices.Equal(got, want) {
		t.Errorf("x after load_inplace of b's folder: %v, b gives %v", got, want)
	}
	if p.LookupAdapter(old.key) == nil {
		t.Fatal("the replaced adapter was freed while held")
	}
	s.releaseLoRA(old)
	if p.LookupAdapter(old.key) != nil || len(p.AdapterNames()) != 1 {
		t.Errorf("after the last release of the replaced adapter the policy holds %v", p.AdapterNames())
	}
}
