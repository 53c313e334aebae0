package arch

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// qwen3_moe's keys: transformers' defaults when absent (and written back), the sparse layers by
// mlp_only_layers and decoder_sparse_step, and errors naming the key.
func TestQwen3MoEConfig(t *testing.T) {
	base := `"model_type":"qwen3_moe","hidden_size":16,"intermediate_size":32,"num_hidden_layers":4,"num_attention_heads":2,"vocab_size":9`
	c, err := ParseConfig([]byte("{" + base + "}"))
	if err != nil {
		t.Fatal(err)
	}
	m := OptionsOf(c).MoE
	if m.Experts != 128 || m.TopK != 8 || m.Inter != 768 || m.NormTopK || m.AuxLossCoef != 0.001 || m.OutputRouterLogits ||
		!slices.Equal(m.Sparse, []bool{true, true, true, true}) || !OptionsOf(c).QKNorm || c.MaxPositionEmbeddings != 32768 {
		t.Fatalf("defaults: %+v", m)
	}
	js, _ := c.MarshalJSON()
	var back map[string]any
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"num_experts": 128.0, "num_experts_per_tok": 8.0, "moe_intermediate_size": 768.0,
		"decoder_sparse_step": 1.0, "norm_topk_prob": false, "router_aux_loss_coef": 0.001, "output_router_logits": false} {
		if back[k] != want {
			t.Errorf("config.json written back: %s = %v, want %v", k, back[k], want)
		}
	}
	if back["architectures"].([]any)[0] != "Qwen3MoeForCausalLM" {
		t.Errorf("architectures %v", back["architectures"])
	}

	for _, tc := range []struct {
		extra  string
		sparse []bool
	}{
		{`,"decoder_sparse_step":2`, []bool{false, true, false, true}},
		{`,"decoder_sparse_step":2,"mlp_only_layers":[3]`, []bool{false, true, false, false}},
		{`,"mlp_only_layers":[0,2]`, []bool{false, true, false, true}},
		{`,"num_experts":0,"num_experts_per_tok":0`, []bool{false, false, false, false}}, // transformers: every MLP dense
	} {
		c, err := ParseConfig([]byte("{" + base + tc.extra + "}"))
		if err != nil {
			t.Fatalf("%s: %v", tc.extra, err)
		}
		if got := OptionsOf(c).MoE.Sparse; !slices.Equal(got, tc.sparse) {
			t.Errorf("%s: sparse layers %v, want %v", tc.extra, got, tc.sparse)
		}
	}

	for _, tc := range []struct{ extra, want string }{
		{`,"num_experts":4,"num_experts_per_tok":5`, "num_experts_per_tok"},
		{`,"decoder_sparse_step":0`, "decoder_sparse_step"},
		{`,"mlp_only_layers":[4]`, "mlp_only_layers"},
		{`,"num_experts":"8"`, "num_experts"},
		{`,"moe_intermediate_size":0`, "moe_intermediate_size"},
		{`,"num_experts":100000`, "num_experts"},
		{`,"use_sliding_window":true`, "use_sliding_window"},
		{`,"router_aux_loss_coef":-1`, "router_aux_loss_coef"},
	} {
		if _, err := ParseConfig([]byte("{" + base + tc.extra + "}")); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.extra, err, tc.want)
		}
	}
}

// Qwen3-30B-A3B's published config.json (Hugging Face, Qwen/Qwen3-30B-A3B): 30,532,122,624
// parameters, as its safetensors hold (the model card: 30.5B, 29.9B without embeddings), of which
// 3,353,032,704 are read per token (the card: 3.3B activated); every expert's weights are in the
// shapes, under transformers' names.
func TestQwen3MoECounts(t *testing.T) {
	c, err := ReadConfig(filepath.Join("testdata", "qwen3-30b-a3b", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := ParamCount(c)
	if err != nil || n != 30532122624 {
		t.Errorf("ParamCount %d (%v), want 30532122624", n, err)
	}
	a, err := ActiveParamCount(c)
	if err != nil || a != 3353032704 {
		t.Errorf("ActiveParamCount %d (%v), want 3353032704", a, err)
	}
	// per layer: q, k, v, o 18,874,368; the router 262,144; 8 experts × 3 × 2048 × 768
	if got := MatmulParams(c); got != 48*(18874368+262144+8*3*2048*768) {
		t.Errorf("MatmulParams %d", got)
	}
	if got := ActiveInter(c, 0); got != 8*768 {
		t.Errorf("ActiveInter %d, want 6144", got)
	}
	shapes, _ := Shapes(c)
	idx := map[string][]int64{}
	for _, w := range shapes {
		idx[w.Name] = w.Shape
	}
	for name, want := range map[string][]int64{
		"model.layers.47.mlp.gate.weight":                 {128, 2048},
		"model.layers.0.mlp.experts.127.down_proj.weight": {2048, 768},
		"model.layers.3.mlp.experts.0.gate_proj.weight":   {768, 2048},
		"model.layers.3.self_attn.q_norm.weight":          {128},
		"model.layers.3.mlp.experts.0.up_proj.weight":     {768, 2048},
		"lm_head.weight": {151936, 2048},
		"model.layers.47.post_attention_layernorm.weight":  {2048},
		"model.layers.12.mlp.experts.64.gate_proj.weight":  {768, 2048},
		"model.layers.12.self_attn.o_proj.weight":          {2048, 4096},
		"model.layers.12.self_attn.k_proj.weight":          {512, 2048},
		"model.embed_tokens.weight":                        {151936, 2048},
		"model.norm.weight":                                {2048},
		"model.layers.0.input_layernorm.weight":            {2048},
		"model.layers.0.mlp.experts.1.down_proj.weight":    {2048, 768},
		"model.layers.0.self_attn.v_proj.weight":           {512, 2048},
		"model.layers.0.self_attn.k_norm.weight":           {128},
		"model.layers.47.mlp.experts.127.up_proj.weight":   {768, 2048},
		"model.layers.47.mlp.experts.127.gate_proj.weight": {768, 2048},
	} {
		if !slices.Equal(idx[name], want) {
			t.Errorf("%s: shape %v, want %v", name, idx[name], want)
		}
	}
	if _, ok := idx["model.layers.0.mlp.gate_proj.weight"]; ok {
		t.Error("a sparse layer has a dense MLP")
	}
	// LoRA on all-linear, rank 8: q, k, v, o and every expert's three projections, not the router.
	if n, err := LoRAParams(c, 8, []string{LoRAAllLinear}); err != nil || n != 421920768 {
		t.Errorf("LoRAParams %d (%v), want 421920768", n, err)
	}
}

// A dense layer among sparse ones (mlp_only_layers) keeps its MLP of intermediate_size, in the
// shapes, the per-token activations and the adapter sizes alike.
func TestQwen3MoEDenseLayer(t *testing.T) {
	c, err := ParseConfig([]byte(`{"model_type":"qwen3_moe","hidden_size":16,"intermediate_size":40,"num_hidden_layers":2,
		"num_attention_heads":2,"vocab_size":9,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,"mlp_only_layers":[0]}`))
	if err != nil {
		t.Fatal(err)
	}
	shapes, _ := Shapes(c)
	var names []string
	for _, w := range shapes {
		names = append(names, w.Name)
	}
	for _, want := range []string{"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.3.down_proj.weight"} {
		if !slices.Contains(names, want) {
			t.Errorf("shapes lack %s", want)
		}
	}
	if slices.Contains(names, "model.layers.0.mlp.gate.weight") || slices.Contains(names, "model.layers.1.mlp.up_proj.weight") {
		t.Errorf("shapes %v", names)
	}
	if ActiveInter(c, 0) != 40 || ActiveInter(c, 1) != 16 {
		t.Errorf("ActiveInter %d %d, want 40 16", ActiveInter(c, 0), ActiveInter(c, 1))
	}
	// down_proj at rank 2: layer 0 (40 + 16)·2, layer 1 four experts of (8 + 16)·2
	if n, err := LoRAParams(c, 2, []string{"down_proj"}); err != nil || n != 112+4*48 {
		t.Errorf("LoRAParams %d (%v), want %d", n, err, 112+4*48)
	}
	d := c
	d.ModelType = Qwen3
	dn, _ := ParamCount(d)
	if a, _ := ActiveParamCount(d); a != dn || MatmulParams(d) != 2*(2*16*16+2*16*16+3*16*40) {
		t.Errorf("dense qwen3: active %d of %d, matmul %d", a, dn, MatmulParams(d))
	}
}
