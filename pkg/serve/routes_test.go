package serve

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
	"github.com/drmas/drmas/pkg/torch"
	"github.com/sugarme/gotch"
)

// moeServer serves a random Qwen3-MoE (3 layers, the first dense; 4 experts, top-2) with the toy
// tokenizer.
func moeServer(t *testing.T) (*policy.Policy, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	tok, err := os.ReadFile(toyDir + "/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := arch.ParseConfig([]byte(`{"model_type": "qwen3_moe", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 3,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 270, "max_position_embeddings": 64,
		"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12, "norm_topk_prob": true, "mlp_only_layers": [0],
		"initializer_range": 0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := torch.Do(func() error {
		m, err := policy.NewRandom(cfg, gotch.CPU, gotch.Float, 3)
		if err != nil {
			return err
		}
		return m.Save(dir)
	}); err != nil {
		t.Fatal(err)
	}
	p := policytest.Load(t, dir)
	s, err := New(p, dir, Options{Window: time.Millisecond, MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.run(ctx); close(done) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	return p, hs
}

// /generate with return_routed_experts answers a mixture-of-experts model's routes as SGLang does
// (meta_info.routed_experts: base64 int32, [prompt + response − 1 tokens, layers, top-k], −1 in the
// dense layer): the experts a scoring pass of the same tokens routes them to. A dense model refuses
// the field, naming it.
func TestGenerateReturnsRoutedExperts(t *testing.T) {
	p, hs := moeServer(t)
	var rep struct {
		OutputIDs []int `json:"output_ids"`
		MetaInfo  struct {
			RoutedExperts *string `json:"routed_experts"`
		} `json:"meta_info"`
	}
	prompt := []int{3, 17, 29, 41, 8}
	body := map[string]any{"input_ids": prompt, "return_routed_experts": true,
		"sampling_params": map[string]any{"max_new_tokens": 6, "temperature": 1, "sampling_seed": 7}}
	if code := post(t, hs.URL+"/generate", body, &rep); code != 200 || rep.MetaInfo.RoutedExperts == nil {
		t.Fatalf("HTTP %d, routed_experts %v", code, rep.MetaInfo.RoutedExperts)
	}
	got, err := llm.RoutesFromBase64(*rep.MetaInfo.RoutedExperts, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(prompt) + len(rep.OutputIDs) - 1; got.Tokens() != n {
		t.Fatalf("routes of %d tokens, want %d", got.Tokens(), n)
	}
	var want policy.Routes
	if err := torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		_, err := p.Score([]policy.Sequence{{PromptIDs: prompt, ResponseIDs: rep.OutputIDs, Record: &want}}, false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	n := got.Tokens() * 3 * 2
	if !slices.Equal(got.IDs, want.IDs[:n]) {
		t.Fatalf("served routes %v, a scoring pass routes the tokens to %v", got.IDs, want.IDs[:n])
	}
	for tok := range got.Tokens() {
		if l0 := got.IDs[tok*6 : tok*6+2]; l0[0] != -1 || l0[1] != -1 {
			t.Fatalf("token %d: dense layer 0 routed to %v, want -1", tok, l0)
		}
	}

	_, dense := toyServer(t, Options{Window: time.Millisecond})
	var e struct {
		Error struct {
			Message string `json:"message"`
			Param   string `json:"param"`
		} `json:"error"`
	}
	if code := post(t, dense.URL+"/generate", map[string]any{"input_ids": []int{60, 97}, "return_routed_experts": true}, &e); code != 400 || e.Error.Param != "return_routed_experts" {
		t.Fatalf("dense model: HTTP %d %+v, want 400 naming return_routed_experts", code, e)
	}
}
