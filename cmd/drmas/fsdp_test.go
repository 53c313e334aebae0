package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Parameter sharding (dist.shard: parameters, pkg/shard): equality with one process, the
// features it works with, the state each rank holds, and resharding resume.

// sameRunWithin is sameRun with a bound on the weights' difference.
func sameRunWithin(t *testing.T, name, one, two string, from int, weights float64) {
	t.Helper()
	sameRun(t, name, one, two, from)
	if wd, where := weightDiff(t, filepath.Join(one, "step-3"), filepath.Join(two, "step-3")); wd > weights {
		t.Errorf("%s: weights differ by %g at %s (bound %g)", name, wd, where, weights)
	}
}

// stateMB is a trained model's weights, gradients and optimizer state a rank held after the last
// iteration (perf/weights_mb, perf/grads_mb, perf/optim_mb).
func stateMB(t *testing.T, dir, model string) float64 {
	t.Helper()
	ms := readMetrics(t, dir)
	last := ms[len(ms)-1]
	total := 0.0
	for _, k := range []string{"perf/weights_mb/", "perf/grads_mb/", "perf/optim_mb/"} {
		v, ok := last[k+model]
		if !ok {
			t.Fatalf("%s: no %s%s", dir, k, model)
		}
		total += v
	}
	return total
}

// TestParameterShardingMatchesOneProcess trains toy-math (one shared model), toy-search-team (three
// models, one per agent) and toy-math-lora (an adapter per agent on a frozen base, sharded) for 3
// iterations in one process and with dist.shard: parameters on 2 and 4 Gloo ranks: the metrics agree
// within 1e-5, the weights within 1e-5 and the transcripts byte for byte; on 4 ranks a full model's
// weights, gradients and optimizer state on a rank are at most 0.3 × one process's.
func TestParameterShardingMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 9 short runs")
	}
	for _, c := range []struct {
		name, config string
		full         []string // models whose state shards (not adapters)
	}{
		{"toy-math", "configs/toy-math.yaml", []string{"small"}},
		{"toy-search-team", "configs/toy-search-team.yaml", []string{"verifier", "searcher", "answerer"}},
		{"toy-math-lora", "configs/toy-math-lora.yaml", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			one := filepath.Join(root, "one")
			run(t, drmasCmd(t, nil, toyRunArgs(c.config, one)...))
			for _, n := range []string{"2", "4"} {
				dir := filepath.Join(root, "parameters-"+n)
				run(t, drmasCmd(t, nil, append(toyRunArgs(c.config, dir), "--set", "dist.shard=parameters", "--nproc", n)...))
				sameRunWithin(t, c.name+" on "+n, one, dir, 1, 1e-5)
				a, _ := os.ReadFile(filepath.Join(one, "rollouts", "step-3.jsonl"))
				b, _ := os.ReadFile(filepath.Join(dir, "rollouts", "step-3.jsonl"))
				if len(a) == 0 || !bytes.Equal(a, b) {
					t.Errorf("%s ranks: transcripts of step 3 differ (%d vs %d bytes)", n, len(a), len(b))
				}
				if n != "4" {
					continue
				}
				for _, m := range c.full {
					whole, shard := stateMB(t, one, m), stateMB(t, dir, m)
					t.Logf("%s: %.3f MB of state per rank on 4 ranks, %.3f MB in one process (%.2f×)", m, shard, whole, shard/whole)
					if shard > 0.3*whole {
						t.Errorf("%s: a rank holds %.3f MB of state, one process %.3f MB: more than 0.3×", m, shard, whole)
					}
				}
			}
		})
	}
}

// TestParameterShardingFeatures: with the KL penalty to a (sharded) reference, validation on rank 0,
// the guard clipping agents' shares, an entropy bonus, the optimizer offloaded, generation from whole
// models (dist.rollout_gather: model), and token budgets that give the ranks different numbers of
// micro-batches, 2 ranks under dist.shard: parameters train as 2 ranks with whole weights do: the
// same arithmetic gathered unit by unit (bit for bit where the micro-batches are the same; the token
// budget's reduce each micro-batch's gradients, a different order of summation).
func TestParameterShardingFeatures(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 4 short runs")
	}
	common := []string{"--set", "algorithm.kl.coef=0.05", "--set", "run.test_freq=2", "--set", "run.val_limit=8", "--set", "run.val_k=2",
		"--set", "algorithm.entropy_coef=0.01", "--nproc", "2"}
	for _, c := range []struct {
		name  string
		extra []string
		bound float64
	}{
		{"kl-validation-guard-offload-gather-model", []string{"--set", "algorithm.guard.window=3", "--set", "algorithm.guard.factor=1.01",
			"--set", "algorithm.guard.action=clip", "--set", "models.0.optim.offload=cpu", "--set", "dist.rollout_gather=model"}, 1e-9},
		{"token-budget", []string{"--set", "algorithm.max_tokens_per_micro_batch=48", "--set", "agents.0.sampling.max_new_tokens=24"}, 1e-5},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			dirs := map[string]string{}
			for _, stage := range []string{"none", "parameters"} {
				dirs[stage] = filepath.Join(root, stage)
				args := append(append(toyRunArgs("configs/toy-math.yaml", dirs[stage]), common...), c.extra...)
				run(t, drmasCmd(t, nil, append(args, "--set", "dist.shard="+stage)...))
			}
			sameRunWithin(t, c.name, dirs["none"], dirs["parameters"], 1, c.bound)
			if _, err := os.Stat(filepath.Join(dirs["parameters"], "reference", "small", "model.safetensors")); err != nil {
				t.Errorf("no KL reference written: %v", err)
			}
			ms := readMetrics(t, dirs["parameters"])
			if _, ok := ms[1]["val/avg@2"]; !ok {
				t.Errorf("step 2 has no validation: %v", keys(ms[1], "val/"))
			}
		})
	}
}

// keys lists a row's keys with a prefix.
func keys(m map[string]float64, prefix string) []string {
	var out []string
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

// TestParameterShardedCheckpointResumes: the checkpoints of a 2-rank run under dist.shard:
// parameters (the weights written unit by unit by rank 0, each rank's optimizer file streamed unit by
// unit, in the format of the other stages) resume on 1 process, on 4 ranks under parameters and on 2
// ranks with whole weights: step 3 ends where the uninterrupted one-process run ends (weights within
// 1e-5), and a one-process checkpoint resumes under parameters on 2 ranks alike.
func TestParameterShardedCheckpointResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 6 short runs")
	}
	extra := []string{"--set", "algorithm.entropy_coef=0.01"} // every step has a gradient: the optimizer state resumed matters
	root := t.TempDir()
	one, two := filepath.Join(root, "one"), filepath.Join(root, "two")
	run(t, drmasCmd(t, nil, toyRunArgs("configs/toy-math.yaml", one, extra...)...))
	run(t, drmasCmd(t, nil, append(toyRunArgs("configs/toy-math.yaml", two, extra...), "--set", "dist.shard=parameters", "--nproc", "2")...))
	if _, err := os.Stat(filepath.Join(two, "step-2", "small", "optim.rank-1-of-2.safetensors")); err != nil {
		t.Fatalf("no partition of rank 1 in the parameter-sharded checkpoint: %v", err)
	}
	for _, r := range []struct {
		name, from string
		args       []string
	}{
		{"2 → 1", two, nil},
		{"2 → 4 parameters", two, []string{"--set", "dist.shard=parameters", "--nproc", "4"}},
		{"2 → 2 whole", two, []string{"--set", "dist.shard=none", "--nproc", "2"}},
		{"1 → 2 parameters", one, []string{"--set", "dist.shard=parameters", "--nproc", "2"}},
	} {
		t.Run(strings.NewReplacer(" ", "", "→", "-to-").Replace(r.name), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			copyTree(t, r.from, dir)
			if err := os.RemoveAll(filepath.Join(dir, "step-3")); err != nil {
				t.Fatal(err)
			}
			run(t, drmasCmd(t, nil, append(append(toyRunArgs("configs/toy-math.yaml", dir, extra...), "--resume"), r.args...)...))
			sameRunWithin(t, r.name, one, dir, 3, 1e-5)
		})
	}
}
