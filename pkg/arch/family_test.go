package arch

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// Every registered family is complete, and a model_type no family claims is rejected with the list.
func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range families {
		if f.ModelType == "" || f.Architecture == "" || seen[f.ModelType] {
			t.Errorf("family %+v: want a unique model_type and an architecture", f)
		}
		seen[f.ModelType] = true
	}
	if !slices.Equal(Names.Names(), ModelTypes()) {
		t.Errorf("Names %v, families %v", Names.Names(), ModelTypes())
	}
	_, err := ParseConfig([]byte(`{"model_type":"gpt2","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9}`))
	if err == nil || !strings.Contains(err.Error(), strings.Join(ModelTypes(), ", ")) {
		t.Fatalf("unknown model_type: %v, want an error listing %v", err, ModelTypes())
	}
}

// Mistral's sliding_window: 4096 when absent (and written back), none when null, rejected when not
// a whole number of tokens ≥ 1.
func TestMistralWindowConfig(t *testing.T) {
	base := `"model_type":"mistral","hidden_size":16,"intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9`
	for _, tc := range []struct {
		extra   string
		window  int64
		wantErr string
	}{
		{"", 4096, ""},
		{`,"sliding_window":null`, 0, ""},
		{`,"sliding_window":7`, 7, ""},
		{`,"sliding_window":0`, 0, "sliding_window"},
		{`,"sliding_window":2.5`, 0, "sliding_window"},
		{`,"sliding_window":"4096"`, 0, "sliding_window"},
	} {
		c, err := ParseConfig([]byte("{" + base + tc.extra + "}"))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want one naming %s", tc.extra, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.extra, err)
		}
		if w := OptionsOf(c).Window; w != tc.window {
			t.Errorf("%s: window %d, want %d", tc.extra, w, tc.window)
		}
		js, _ := c.MarshalJSON()
		var back map[string]any
		_ = json.Unmarshal(js, &back)
		if v, ok := back["sliding_window"]; !ok || (tc.window > 0 && v != float64(tc.window)) {
			t.Errorf("%s: config.json written back has sliding_window %v", tc.extra, v)
		}
	}
}

// Gemma's defaults (head_dim 256, tied embeddings) and its activation key.
func TestGemmaConfig(t *testing.T) {
	base := `"model_type":"gemma","hidden_size":16,"intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9`
	c, err := ParseConfig([]byte("{" + base + `,"hidden_act":"gelu","hidden_activation":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.HeadDim != 256 || !c.TieWordEmbeddings || OptionsOf(c).EmbedScale != 4 {
		t.Fatalf("defaults: head_dim %d, tied %v, embedding scale %v", c.HeadDim, c.TieWordEmbeddings, OptionsOf(c).EmbedScale)
	}
	c, err = ParseConfig([]byte("{" + base + `,"tie_word_embeddings":false,"head_dim":4}`))
	if err != nil || c.TieWordEmbeddings || c.HeadDim != 4 {
		t.Fatalf("explicit keys: %v, tied %v, head_dim %d", err, c.TieWordEmbeddings, c.HeadDim)
	}
	if _, err := ParseConfig([]byte("{" + base + `,"hidden_activation":"relu"}`)); err == nil || !strings.Contains(err.Error(), "hidden_activation") {
		t.Fatalf("hidden_activation relu: %v, want an error naming the key", err)
	}
}

// A family added for a test is in every list (Names, ModelTypes, lookups) until it is removed.
func TestAddFamilyForTest(t *testing.T) {
	before := Names.Names()
	remove := AddFamilyForTest(&Family{ModelType: "aaa", Architecture: "AaaForCausalLM"})
	if !Names.Has("aaa") || !slices.Contains(ModelTypes(), "aaa") || lookup("aaa") == nil || Names.Names()[0] != "aaa" {
		t.Errorf("added: Names %v, ModelTypes %v", Names.Names(), ModelTypes())
	}
	remove()
	if !slices.Equal(Names.Names(), before) || lookup("aaa") != nil {
		t.Errorf("removed: Names %v, want %v", Names.Names(), before)
	}
}
