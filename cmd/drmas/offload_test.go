package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestShardedOffloadMatchesOneProcess: 2 Gloo ranks under dist.shard: gradients with both models'
// optimizer state offloaded (models[].optim.offload: cpu, each rank's partition in host memory and
// stepped there) end as one process without offload does, within the data-parallel test's bounds
// (sameRun); each rank's optimizer partition is saved as without offload.
func TestShardedOffloadMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 2 short runs")
	}
	b, err := os.ReadFile("../../configs/toy-math.yaml")
	if err != nil {
		t.Fatal(err)
	}
	two := strings.Replace(string(b), "models:\n", "models:\n  - id: checker\n    init: {model_type: qwen2, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, initializer_range: 0.05}\n    tokenizer: configs/toy/tokenizer.json\n    optim: {lr: 1.0e-3, weight_decay: 0.0, grad_clip: 1.0}\n", 1)
	two = strings.Replace(two, "{name: verifier, model: small", "{name: verifier, model: checker", 1)
	root := t.TempDir()
	config := filepath.Join(root, "two-models.yaml")
	if err := os.WriteFile(config, []byte(two), 0o644); err != nil {
		t.Fatal(err)
	}
	one, sharded := filepath.Join(root, "one"), filepath.Join(root, "two-offload")
	run(t, drmasCmd(t, nil, toyRunArgs(config, one)...))
	run(t, drmasCmd(t, nil, append(toyRunArgs(config, sharded, "--set", "models.0.optim.offload=cpu", "--set", "models.1.optim.offload=cpu"),
		"--set", "dist.shard=gradients", "--nproc", "2")...))
	sameRun(t, "2 sharded ranks, offloaded", one, sharded, 1)
	parts, _ := filepath.Glob(filepath.Join(sharded, "step-3", "*", "optim.rank-1-of-2.safetensors"))
	if len(parts) != 2 {
		t.Errorf("step-3: %d optimizer partitions of rank 1, want 2", len(parts))
	}
}
