package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

// A model's vocab_size and a tokenizer's ids have one bound: pkg/arch's (which no longer imports the
// tokenizer for it) and the tokenizer's own are the same number.
func TestVocabBoundsAgree(t *testing.T) {
	if arch.MaxVocabSize != tokenizer.MaxVocabSize || arch.MaxSizes["vocab_size"] != arch.MaxVocabSize {
		t.Fatalf("arch.MaxVocabSize %d, MaxSizes[vocab_size] %d, tokenizer.MaxVocabSize %d",
			arch.MaxVocabSize, arch.MaxSizes["vocab_size"], tokenizer.MaxVocabSize)
	}
}

// A model config.json with a non-positive or non-finite rope_theta or rms_norm_eps is refused
// (before: rope_theta -1 loaded and generation printed NUL bytes).
func TestConfigRejectsBadFloats(t *testing.T) {
	base := `{"model_type": "qwen2", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
		"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10, "max_position_embeddings": 64, %s}`
	for field, want := range map[string]string{`"rope_theta": -1`: "rope_theta", `"rms_norm_eps": -1e-6`: "rms_norm_eps"} {
		_, err := arch.ParseConfig([]byte(strings.Replace(base, "%s", field, 1)))
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

// Sizes in config.json beyond pkg/config's init ranges are refused by name before anything is built
// (before: hidden_size 1,048,576 asked libtorch for 4.4 TB in `drmas roundtrip`); the published
// configs in configs/models stay within them.
func TestConfigSizeBounds(t *testing.T) {
	base := `{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 64}`
	for key, v := range map[string]string{"hidden_size": "1048576", "intermediate_size": "1000000", "num_hidden_layers": "100000",
		"num_attention_heads": "4096", "num_key_value_heads": "4096", "head_dim": "16384", "vocab_size": "1000000000",
		"max_position_embeddings": "10000000"} {
		text := regexp.MustCompile(`"`+key+`": \d+`).ReplaceAllString(base, `"`+key+`": `+v)
		if text == base {
			text = strings.TrimSuffix(base, "}") + `, "` + key + `": ` + v + "}"
		}
		if strings.Count(text, `"`+key+`"`) != 1 {
			t.Fatalf("%s: %s", key, text)
		}
		_, err := arch.ParseConfig([]byte(text))
		if want := key + " " + v + " exceeds the bound"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s %s: err %v, want one containing %q", key, v, err, want)
		}
	}
	models, _ := filepath.Glob("../../configs/models/*.json")
	if len(models) == 0 {
		t.Fatal("no configs/models/*.json")
	}
	for _, p := range models {
		if _, err := arch.ReadConfig(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// A model whose weights alone exceed the machine's memory is refused before any tensor is made:
// against a small MemTotal, and against the real one for a model within the size bounds that is
// larger than any machine (70 T parameters).
func TestModelLargerThanMemoryRefused(t *testing.T) {
	c := tinyConfig(arch.Qwen2, 1000)
	kb := c.NumParams() * 3 / 1024 // room for bfloat16 weights (2 bytes each), not float32 (4)
	fake := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(fake, []byte(fmt.Sprintf("MemTotal:  %d kB\nMemFree:  %d kB\n", kb, kb/2)), 0o644); err != nil {
		t.Fatal(err)
	}
	old := memInfoPath
	memInfoPath = fake
	onTorch(t, func() error {
		if _, err := NewRandom(c, gotch.CPU, gotch.Float, 1); err == nil || !strings.Contains(err.Error(), "more than this machine's") {
			t.Errorf("float32 over the memory: err %v", err)
		}
		m, err := NewRandom(c, gotch.CPU, gotch.BFloat16, 1)
		if err != nil {
			t.Errorf("bfloat16 within the memory: %v", err)
		} else {
			m.Free()
		}
		return nil
	})
	memInfoPath = old
	if _, ok := memTotal(); !ok {
		t.Skip("no /proc/meminfo")
	}
	huge := arch.Config{ModelType: arch.Qwen2, HiddenSize: 1 << 16, IntermediateSize: 1 << 18, NumHiddenLayers: 1 << 10,
		NumAttentionHeads: 64, VocabSize: 1 << 22, MaxPositionEmbeddings: 4096}
	huge.FillDefaults()
	if err := huge.Validate(); err != nil {
		t.Fatal(err)
	}
	onTorch(t, func() error {
		if _, err := NewRandom(huge, gotch.CPU, gotch.BFloat16, 1); err == nil || !strings.Contains(err.Error(), "more than this machine's") {
			t.Errorf("70 T parameters: err %v", err)
		}
		return nil
	})
}
