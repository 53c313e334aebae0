package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/train"
)

// toyLoRATeam is configs/toy-math-lora.yaml shrunk to a few seconds: a tiny frozen base ("toy")
// with a rank-4 adapter per agent (solver, verifier), dtype as given, three iterations, an entropy
// bonus so that the adapters change every iteration.
func toyLoRATeam(t *testing.T, dir, dtype string) *config.Config {
	t.Helper()
	sets := []string{"run.dir=" + dir, "run.steps=3", "run.save_every=1", "run.test_freq=0", "run.keep_last=0",
		"run.threads=1", "warmup.steps=2", "warmup.batch_size=8", "models.0.dtype=" + dtype,
		"models.0.init={model_type: qwen2, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}",
		"models.1.lora.rank=4", "models.1.lora.alpha=8", "models.2.lora.rank=4", "models.2.lora.alpha=8",
		"algorithm.batch_size=4", "algorithm.group_size=4", "algorithm.micro_batch_size=8",
		"agents.0.sampling.max_new_tokens=4", "agents.1.sampling.max_new_tokens=4", "toy.train=64", "toy.val=8",
		"algorithm.entropy_coef=0.05"} // a gradient every iteration, whatever the rewards
	cfg, err := config.Load("../../configs/toy-math-lora.yaml", sets)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Models {
		if cfg.Models[i].Tokenizer != "" {
			cfg.Models[i].Tokenizer = "../../" + cfg.Models[i].Tokenizer
		}
	}
	return cfg
}

// Adapters reach the engines by name every iteration: on a float64 toy base served by two drmas
// serve replicas, through vLLM's and SGLang's LoRA endpoints, a run with one adapter per agent
// equals the local run (metrics, and the final adapters byte for byte), the served log-probs match
// the trainer's per adapter, and only the latest version's folders are kept.
func TestEnginesTrainLoRALikeLocal(t *testing.T) {
	local := t.TempDir()
	if err := runTraining(t, toyLoRATeam(t, local, "float64"), false); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"solver", "verifier"} { // else the adapters never change and prove nothing
		if g := column(t, local, "grad_norm/model/"+id); len(g) != 3 || slices.Contains(g, 0) {
			t.Fatalf("grad_norm/model/%s = %v: the adapter does not train in some iteration", id, g)
		}
	}
	start := otherToyBase(t, "float64")
	a := startReplica(t, start, "--dtype", "float64")
	b := startReplica(t, start, "--dtype", "float64")
	for _, kind := range []string{engine.VLLM, engine.SGLang} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			if err := runTraining(t, withEngine(toyLoRATeam(t, dir, "float64"), kind, time.Minute, a.URL, b.URL), false); err != nil {
				t.Fatal(err)
			}
			worst := metricsDiff(t, local, dir, 3)
			t.Logf("%s: largest metric difference %g", kind, worst)
			if worst > 1e-9 {
				t.Errorf("%s run differs from the local run: metric diff %g", kind, worst)
			}
			for _, id := range []string{"solver", "verifier"} {
				wl, err := os.ReadFile(filepath.Join(local, "step-3", id, "adapter_model.safetensors"))
				if err != nil {
					t.Fatal(err)
				}
				wr, err := os.ReadFile(filepath.Join(dir, "step-3", id, "adapter_model.safetensors"))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(wl, wr) {
					t.Errorf("%s: final adapter %s differs from the local run's", kind, id)
				}
				diffs := column(t, dir, "rollout/logprob_diff/"+id+"/max")
				t.Logf("%s: %s served-vs-trainer log-prob max diff per iteration %v", kind, id, diffs)
				if len(diffs) != 3 {
					t.Errorf("rollout/logprob_diff/%s logged in %d of 3 iterations", id, len(diffs))
				}
				for i, d := range diffs {
					if d > 1e-4 {
						t.Errorf("%s iteration %d: served log-probs differ from the trainer's by %g", id, i+1, d)
					}
				}
				if got := column(t, dir, "rollout/replicas/"+id); fmt.Sprint(got) != "[2 2 2]" {
					t.Errorf("rollout/replicas/%s = %v, want 2 in each iteration", id, got)
				}
				if _, err := os.Stat(filepath.Join(dir, engine.WeightsDir, id, "v3", "adapter_config.json")); err != nil {
					t.Errorf("the last synced adapter folder: %v", err)
				}
				if old, _ := filepath.Glob(filepath.Join(dir, engine.WeightsDir, id, "v[0-2]")); len(old) > 0 {
					t.Errorf("old adapter versions kept: %v", old)
				}
			}
			if vs, _ := filepath.Glob(filepath.Join(dir, engine.WeightsDir, "toy", "v*")); len(vs) != 1 {
				t.Errorf("the frozen base's served folders: %v, want the one synced once", vs)
			}
			// The run leaves no adapter loaded on the replicas (its last versions unloaded at the end).
			for _, r := range []*server{a, b} {
				if got := servedModels(t, r.URL); len(got) != 1 {
					t.Errorf("replica %s after the run serves %v, want the base alone", r.URL, got)
				}
			}
		})
	}
}

// Data-parallel ranks on engine-served adapters: two Gloo ranks, each training one adapter per
// agent and sampling its share of the rollouts from two drmas serve replicas of the frozen base
// (every rank routing its requests to the adapter names rank 0 loaded for the step), end as the
// one-process local run does: the same metrics and adapters, as data parallelism without engines.
func TestEnginesTrainLoRADataParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 2 short runs, one of them on 2 ranks")
	}
	args := func(dir string, extra ...string) []string {
		return append(toyRunArgs("configs/toy-math-lora.yaml", dir, "--set", "run.threads=1",
			"--set", "models.0.init={model_type: qwen2, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}",
			"--set", "models.1.lora.rank=4", "--set", "models.1.lora.alpha=8", "--set", "models.2.lora.rank=4", "--set", "models.2.lora.alpha=8",
			"--set", "agents.0.sampling.max_new_tokens=4", "--set", "agents.1.sampling.max_new_tokens=4",
			"--set", "algorithm.entropy_coef=0.05"), extra...) // a gradient every iteration, whatever the rewards
	}
	root := t.TempDir()
	one := filepath.Join(root, "one")
	run(t, drmasCmd(t, nil, args(one)...))
	start := otherToyBase(t, "float32")
	a, b := startReplica(t, start), startReplica(t, start)
	two := filepath.Join(root, "two")
	run(t, drmasCmd(t, nil, args(two, "--set", "models.0.rollout.engine=vllm", "--set", "models.0.rollout.urls=["+a.URL+", "+b.URL+"]",
		"--set", "models.0.rollout.api_key="+engineKey, "--nproc", "2")...))
	sameRun(t, "LoRA, 2 ranks on engines", one, two, 1)
	for _, id := range []string{"solver", "verifier"} {
		if d := column(t, two, "rollout/logprob_diff/"+id+"/max"); len(d) != 3 {
			t.Errorf("rollout/logprob_diff/%s logged in %d of 3 iterations", id, len(d))
		}
	}
}

// servedModels lists the ids GET /v1/models gives (the base, then every loaded adapter).
func servedModels(t *testing.T, url string) []string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+engineKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// otherToyBase writes the tiny toy LoRA base of toyLoRATeam, in dtype, from another seed than the
// runs use, as a model folder for replicas to start from: the trainer must sync its own base.
func otherToyBase(t *testing.T, dtype string) string {
	t.Helper()
	cfg := toyLoRATeam(t, t.TempDir(), dtype)
	cfg.Run.Seed = 99
	team, err := train.LoadTeam(cfg, "cpu", "")
	if err != nil {
		t.Fatal(err)
	}
	defer team.Close()
	dir := t.TempDir()
	if err := saveModel(team, "toy", dir); err != nil {
		t.Fatal(err)
	}
	return dir
}
