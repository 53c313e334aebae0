package arch

import (
	"path/filepath"
	"testing"
)

// The paper's models, from the config.json files under configs/models: Qwen3-4B 4.02B parameters
// (tied embeddings), Qwen2.5-7B-Instruct 7.62B (its own lm_head), as Hugging Face's model cards say.
func TestParamCountPaperModels(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		want int64
	}{
		{"qwen3-4b", 4022468096},
		{"qwen2.5-7b", 7615616512},
	} {
		cfg, err := ReadConfig(filepath.Join("..", "..", "configs", "models", tc.dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		n, err := ParamCount(cfg)
		if err != nil || n != tc.want {
			t.Errorf("%s: %d parameters (%v), want %d", tc.dir, n, err, tc.want)
		}
	}
}
