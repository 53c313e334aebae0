package arch

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// ParseConfig fills the defaults; MarshalJSON and UnmarshalJSON round-trip unknown keys; the checks
// name what they refuse.
func TestConfigDefaultsAndErrors(t *testing.T) {
	c, err := ParseConfig([]byte(`{"model_type":"qwen2","hidden_size":64,"intermediate_size":128,
		"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"eos_token_id":[5,6]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.NumKeyValueHeads != 4 || c.HeadDim != 16 || c.RopeTheta != 10000 || c.RMSNormEps != 1e-6 ||
		len(c.EOSTokenIDs) != 2 || c.TorchDType != "float32" {
		t.Fatalf("defaults not filled: %+v", c)
	}
	// MarshalJSON and UnmarshalJSON round-trip, unknown keys included.
	c.raw["sliding_window"] = json.RawMessage("4096")
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseConfig(js)
	if err != nil {
		t.Fatal(err)
	}
	if back.HiddenSize != 64 || len(back.EOSTokenIDs) != 2 || string(back.raw["sliding_window"]) != "4096" {
		t.Fatalf("round trip through %s gave %+v", js, back)
	}
	for _, tc := range []struct{ json, want string }{
		{`{"model_type":"gpt2","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9}`, "model_type"},
		{`{"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":3,"vocab_size":9}`, "num_key_value_heads"},
		{`{"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9,"rope_scaling":{"rope_type":"yarn","factor":4}}`, "yarn"},
		{`{"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9,"hidden_act":"gelu"}`, "hidden_act"},
		{`{"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":0}`, "vocab_size"},
	} {
		if _, err := ParseConfig([]byte(tc.json)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%s) = %v, want an error naming %s", tc.json, err, tc.want)
		}
	}
}

// Every canonical dtype name parses back to its dtype, and the aliases to theirs.
func TestDTypeNames(t *testing.T) {
	if got := DTypeNames(); !slices.Equal(got, []string{"float32", "bfloat16", "float16", "float64"}) {
		t.Fatalf("DTypeNames %v", got)
	}
	for d := Float32; d <= Float64; d++ {
		if back, err := ParseDType(d.String()); err != nil || back != d {
			t.Errorf("%v: parsed back as %v (%v)", d, back, err)
		}
	}
	for s, want := range map[string]DType{"torch.bfloat16": BFloat16, "half": Float16, "FP32": Float32, "double": Float64} {
		if d, err := ParseDType(s); err != nil || d != want {
			t.Errorf("%s: %v (%v), want %v", s, d, err, want)
		}
	}
	if _, err := ParseDType("int8"); err == nil {
		t.Error("int8: no error")
	}
}
