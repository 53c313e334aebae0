package plan

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Llama-3.1-70B-shaped config.json (every size within pkg/policy's bounds).
const bigModel = `{"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
 "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 4194304,
 "rope_theta": 500000, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}`

// Configs whose plan overflows int64 are refused naming the keys (before: a rollout KV cache of
// 2.9·10²¹ bytes wrapped around, and the plan said a few GB that fit); the same keys at sane values
// still plan, and a device's peak saturates rather than wrapping.
func TestPlanRefusesAbsurdSizes(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		says []string
	}{
		{[]string{"algorithm.batch_size=65536", "algorithm.group_size=65536", "data.max_prompt_length=4194304", "algorithm.micro_batch_size=1"},
			[]string{"rollout KV cache", "algorithm.batch_size × group_size", "data.max_prompt_length", "models[0]"}},
		{[]string{"algorithm.micro_batch_size=65536", "data.max_prompt_length=4194304", "models.0.gradient_checkpointing=true"},
			[]string{"activations", "algorithm.micro_batch_size", "data.max_prompt_length"}},
		{[]string{"algorithm.micro_batch_size=65536", "data.max_prompt_length=1048576", "agents.0.sampling.max_new_tokens=1048576", "algorithm.batch_size=1", "algorithm.group_size=1"},
			[]string{"activations", "agents[].sampling.max_new_tokens"}},
	} {
		cfg := smallRun(t, tc.sets...)
		if err := os.WriteFile(filepath.Join(cfg.Models[0].Path, "config.json"), []byte(bigModel), 0o644); err != nil {
			t.Fatal(err)
		}
		pl, err := Build(cfg, Options{Device: "cuda"})
		if err == nil {
			d := pl.Devices[0]
			t.Errorf("%v: planned at %d bytes (%.3g), want a refusal", tc.sets, d.PeakBytes, float64(d.PeakBytes))
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%v: %v: does not name %q", tc.sets, err, s)
			}
		}
		t.Logf("%v: %v", tc.sets, err)
	}

	// Large but representable: planned, and it does not fit.
	cfg := smallRun(t, "algorithm.batch_size=1024", "algorithm.group_size=16", "data.max_prompt_length=32768")
	if err := os.WriteFile(filepath.Join(cfg.Models[0].Path, "config.json"), []byte(bigModel), 0o644); err != nil {
		t.Fatal(err)
	}
	pl, err := Build(cfg, Options{Device: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	if d := pl.Devices[0]; d.PeakBytes < 1e14 || d.PeakBytes >= math.MaxInt64 {
		t.Errorf("a 70B model with 16,384 rollout rows of 32k tokens: peak %d bytes", d.PeakBytes)
	}

	if satSum(math.MaxInt64-1, 2) != math.MaxInt64 || satMul(3, math.MaxInt64/2) != math.MaxInt64 || satSum(1, 2) != 3 || satMul(3, 4) != 12 {
		t.Error("satSum / satMul")
	}
}

// --device-memory NaN (and other non-finite or non-positive sizes) is refused naming the value
// (before: NaN parsed, became a size that turned the memory check off).
func TestParseMemoryRefusesNonFinite(t *testing.T) {
	for _, bad := range []string{"NaN", "nan", "NaNGB", "cuda:0=NaN", "cpu=-NaN", "Inf", "+InfGB", "-0", "0GB", "-5GB"} {
		_, err := ParseMemory([]string{bad})
		if err == nil || !strings.Contains(err.Error(), "--device-memory") || !strings.Contains(err.Error(), "positive, finite") {
			t.Errorf("--device-memory %s: %v, want a refusal", bad, err)
		}
	}
}

// A device named twice in --device-memory (across commas or repeats, however spelled: cuda is cuda:0)
// is refused naming the flag and both values (before: the last one won silently).
func TestParseMemoryRefusesDuplicates(t *testing.T) {
	for _, vals := range [][]string{{"cpu=1GB,cpu=2GB"}, {"cpu=1GB", "cpu=2GB"}, {"cuda=8GB,cuda:0=16GB"}, {"80GB", "40GB"}, {"CPU=1GB,cpu=1GB"}} {
		_, err := ParseMemory(vals)
		if err == nil || !strings.Contains(err.Error(), "--device-memory") || !strings.Contains(err.Error(), "twice") {
			t.Errorf("--device-memory %q: %v, want a refusal naming the flag", vals, err)
		}
	}
	if _, err := ParseMemory([]string{"80GB", "cpu=16GB,cuda:1=40GB"}); err != nil {
		t.Errorf("every device and two named ones: %v", err)
	}
}
