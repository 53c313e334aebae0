package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `drmas roundtrip` refuses a config.json beyond the size bounds at once, naming the file and the key
// (before: hidden_size 1,048,576 asked libtorch for 4.4 TB and died with a stack trace; 100,000
// layers reached 9 GB).
func TestRoundTripRefusesHugeConfig(t *testing.T) {
	base, err := os.ReadFile("../../configs/models/qwen3-0.6b.json")
	if err != nil {
		t.Fatal(err)
	}
	for key, v := range map[string]string{"hidden_size": "1048576", "num_hidden_layers": "100000"} {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "config.json")
		text := string(base)
		i := strings.Index(text, `"`+key+`":`)
		if i < 0 {
			t.Fatalf("qwen3-0.6b.json has no %s", key)
		}
		j := i + strings.IndexAny(text[i:], ",\n}")
		text = text[:i] + `"` + key + `": ` + v + text[j:]
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, extra := range [][]string{nil, {"--dtype", "bfloat16", "--train"}} {
			args := append([]string{"roundtrip", "--config", cfg, "--out", filepath.Join(dir, "out")}, extra...)
			_, _, err := execDrmas(t, args...)
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), cfg) || !strings.Contains(err.Error(), key+" "+v+" exceeds the bound") {
				t.Errorf("%s %s %v: err = %v, want a usage error (exit 2) naming %s and the key", key, v, extra, err, cfg)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "out")); err == nil {
			t.Errorf("%s: --out was created", key)
		}
	}
	// Within the bounds but larger than any machine's memory (70 T parameters): refused before init.
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	big := `{"model_type": "qwen2", "hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 1024,
		"num_attention_heads": 64, "vocab_size": 4194304, "max_position_embeddings": 4096}`
	if err := os.WriteFile(cfg, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = execDrmas(t, "roundtrip", "--config", cfg, "--out", filepath.Join(dir, "out"), "--dtype", "bfloat16")
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "more than this machine's") {
		t.Errorf("70 T parameters: err = %v, want a usage error (exit 2) about memory", err)
	}
}

// --max-shard-size that is not a positive, finite size that fits is refused naming the flag (before:
// NaNGB and 1e30GB were accepted, the first as a shard size of NaN bytes, the second overflowing).
func TestRoundTripRefusesBadShardSize(t *testing.T) {
	for _, v := range []string{"NaNGB", "1e30GB", "InfMB", "-1GB", "0GB", "5 apples"} {
		_, _, err := execDrmas(t, "roundtrip", "--config", "../../configs/models/qwen3-0.6b.json", "--out", filepath.Join(t.TempDir(), "out"), "--max-shard-size", v)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--max-shard-size") || !strings.Contains(err.Error(), v) {
			t.Errorf("--max-shard-size %s: err = %v, want a usage error naming the flag and the value", v, err)
		}
	}
}
