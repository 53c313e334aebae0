package policy

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A model config.json with a non-positive or non-finite rope_theta or rms_norm_eps is refused
// (before: rope_theta -1 loaded and generation printed NUL bytes).
func TestConfigRejectsBadFloats(t *testing.T) {
	base := `{"model_type": "qwen2", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
		"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10, "max_position_embeddings": 64, %s}`
	for field, want := range map[string]string{`"rope_theta": -1`: "rope_theta", `"rms_norm_eps": -1e-6`: "rms_norm_eps"} {
		_, err := ParseConfig([]byte(strings.Replace(base, "%s", field, 1)))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want one naming %s", field, err, want)
		}
	}
}

// A FIFO in place of model.safetensors is refused at once instead of blocking the reader.
func TestSafetensorsFIFORefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "model.safetensors")
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckSafetensors(p); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("err %v", err)
	}
}
