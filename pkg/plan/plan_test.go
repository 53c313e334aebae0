package plan

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
)

// smallModel is a Qwen2 config.json (q/k/v biases, untied lm_head) small enough to count by hand.
const smallModel = `{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": false,
 "max_position_embeddings": 512, "rope_theta": 10000, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}`

// smallRun writes a model folder holding only config.json and a run config over it; sets override it.
func smallRun(t *testing.T, sets ...string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	model := filepath.Join(dir, "model")
	if err := os.MkdirAll(model, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte(smallModel), 0o644); err != nil {
		t.Fatal(err)
	}
	yaml := `run: {dir: ` + filepath.Join(dir, "run") + `, test_freq: 0}
models:
  - {id: m, path: ` + model + `, device: cpu, dtype: bfloat16}
agents:
  - {name: solver, model: m, sampling: {max_new_tokens: 32}}
  - {name: verifier, model: m, sampling: {max_new_tokens: 16}}
orchestra: {type: math}
data: {train: train.jsonl, max_prompt_length: 64}
algorithm: {batch_size: 4, group_size: 2, micro_batch_size: 3, kl: {coef: 0.1}}
`
	path := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, sets)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The plan of a small config, every part worked out by hand from the formulas in docs/memory-plan.md.
func TestPlanByHand(t *testing.T) {
	// Parameters: embed + lm_head 2·100·64; per layer q 64·64+64, k and v 64·32+32 each, o 64·64,
	// MLP 3·64·128, two norms 2·64; the final norm 64.
	const P = 2*100*64 + 2*(64*64+64+2*(64*32+32)+64*64+3*64*128+2*64) + 64
	const e = 2 // bfloat16
	// Micro-batch 3, sequences of 64 (data.max_prompt_length) + 32 (the solver's max_new_tokens).
	const B, T, R = 3, 96, 32
	perLayer := int64(B * T * (ActHidden*64 + ActIntermediate*128 + ActAttention*(4+2*2)*16) * e)
	want := Parts{
		Weights: P * e, Master: P * 4, Gradients: P * e, Optimizer: P * 8, Reference: P * e,
		Activations: 3 * perLayer,                     // 2 layers, and the gradients of the one in backward
		Attention:   4 * B * 4 * T * T * 4,            // 4 copies × B × heads × min(T, 256) × T float32
		Logits:      B * R * 100 * 4 * 3,              // B·R < 1024 response tokens × vocab × 3 float32 copies
		RolloutKV:   2 * 2 * 2 * 16 * e * T * (4 * 2), // K, V × layers × kv heads × head dim × e × T × batch·group
		DecodeCopy:  P * e,                            // CPU
		OptimStep:   3 * 128 * 64 * 4,                 // 3 float32 copies of the largest parameter (the MLP's)
		Overhead:    CPUOverhead,
	}
	want.total()
	for _, ckpt := range []bool{false, true} {
		cfg := smallRun(t)
		cfg.Models[0].GradientCheckpointing = ckpt
		pl, err := Build(cfg, Options{Device: "cuda"})
		if err != nil {
			t.Fatal(err)
		}
		w := want
		if ckpt {
			w.Activations = 2*B*T*64*e + 2*perLayer // each layer's input, one layer recomputed and its gradients
		}
		// Every tensor is under 32 MiB: the C heap serves all of it and holds it from phase to phase
		// (AdamW's scratch, 32 KiB, too: nothing is mapped on top). The rollout's: each layer's k and
		// v, and the decoding layout's matrices (q/k/v fused, o, gate/up fused, down; lm_head).
		w.UpdateHeap = w.Activations + w.Attention + w.Logits
		w.KVHeap = w.RolloutKV
		w.DecodeHeap = e * (2*(64*(4+2*2)*16+64*64+64*2*128+128*64) + 64*100)
		w.total()
		if w.Held != w.UpdateHeap+w.KVHeap+w.DecodeHeap {
			t.Fatalf("held %d, want the update's %d and the rollout's %d", w.Held, w.UpdateHeap, w.KVHeap+w.DecodeHeap)
		}
		if len(pl.Devices) != 1 || len(pl.Models) != 1 {
			t.Fatalf("plan of %d devices, %d models; want 1, 1", len(pl.Devices), len(pl.Models))
		}
		m, d := pl.Models[0], pl.Devices[0]
		if m.Params != P || m.MicroBatch != B || m.PromptTokens+m.ResponseTokens != T || m.RolloutRows != 8 || m.PromptBound != boundKey {
			t.Errorf("ckpt=%v: model %+v; want %d params, micro-batch %d, %d tokens, 8 rollout rows, bound %s", ckpt, m, P, B, T, boundKey)
		}
		mp := m.Parts
		mp.Overhead = CPUOverhead
		if mp != w {
			t.Errorf("ckpt=%v: model parts\n%+v\nwant\n%+v", ckpt, mp, w)
		}
		if d.Device != "cpu" || d.Parts != w {
			t.Errorf("ckpt=%v: device %s parts\n%+v\nwant\n%+v", ckpt, d.Device, d.Parts, w)
		}
		// The rollout after an update runs over the held heap; its layout's copy of what is not a
		// layer matrix or lm_head (the embedding, norms and biases P·e counts) is the mapped rest,
		// and here that is the peak.
		mapped := w.DecodeCopy - w.DecodeHeap
		if peak := w.Static + w.Held + mapped + CPUOverhead; d.PeakBytes != peak || w.Held+mapped <= w.Update {
			t.Errorf("ckpt=%v: peak %d, want %d (static + held + mapped rollout > static + update %d)", ckpt, d.PeakBytes, peak, w.Static+w.Update)
		}
	}
}

// Two models on one device: static memory adds up; the update is the larger model's, the rollout
// the larger KV cache with both decoding layouts; CPU ranks of --nproc multiply it.
func TestPlanSharedDevice(t *testing.T) {
	cfg := smallRun(t)
	n0 := cfg.Models[0]
	n0.ID = "n"
	cfg.Models = append(cfg.Models, n0)
	cfg.Agents[1].Model = "n"
	one, err := Build(smallRun(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	two, err := Build(cfg, Options{HostRanks: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := one.Models[0]
	n := two.Models[1] // the verifier's: 64 + 16 tokens
	d := two.Devices[0]
	if len(two.Devices) != 1 || d.Ranks != 2 || d.Static != m.Static+n.Static || d.Update != max(m.Update, two.Models[0].Update) ||
		d.Rollout != max(two.Models[0].RolloutKV, n.RolloutKV)+2*m.DecodeCopy || d.Held != max(two.Models[0].UpdateHeap, n.UpdateHeap)+two.Models[0].KVHeap+2*m.DecodeHeap {
		t.Errorf("shared device %+v from models %+v and %+v", d, two.Models[0].Parts, n.Parts)
	}
	if want := 2 * (d.Static + max(d.Update, d.Rollout, d.heldPhases()) + CPUOverhead); d.PeakBytes != want {
		t.Errorf("peak %d, want %d (two ranks)", d.PeakBytes, want)
	}
}

// A plan that does not fit its stated capacity is an error naming the device and the keys that
// change it, with a change that makes it fit; an unknown capacity is a warning only.
func TestPlanCheck(t *testing.T) {
	pl, err := Build(smallRun(t), Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	d := pl.Devices[0]
	// Enough for the plan with checkpointing and a micro-batch of 1, not for the plan as it is.
	capacity := d.Static + d.Rollout + CPUOverhead + d.Update/3
	pl.Capacities(Options{Memory: map[string]int64{"cpu": capacity}})
	_, err = pl.Check()
	if err == nil {
		t.Fatalf("peak %d on a %d-byte device: no error", pl.Devices[0].PeakBytes, capacity)
	}
	for _, key := range []string{"cpu needs", "algorithm.micro_batch_size", "models[0].gradient_checkpointing", "agents[0].sampling.max_new_tokens",
		"agents[1].sampling.max_new_tokens", "data.max_prompt_length", "models[0].device", "--device-memory", "it fits with"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not name %q", err, key)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q: more than one line", err)
	}
	if fix := pl.Devices[0].Fix; fix == "" {
		t.Error("no fix found")
	}
	pl.Capacities(Options{Capacity: func(string) (int64, string, error) { return 0, "", os.ErrNotExist }})
	warnings, err := pl.Check()
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "not checked") {
		t.Errorf("unknown capacity: warnings %q, err %v; want one warning", warnings, err)
	}
	pl.Capacities(Options{Memory: map[string]int64{"": 1 << 50}})
	if warnings, err := pl.Check(); err != nil || len(warnings) != 0 || !*pl.Devices[0].Fits {
		t.Errorf("1 PiB: warnings %q, err %v", warnings, err)
	}
}

// The toy prompt bound is measured from the orchestra's real prompts (a few characters of a
// char-level tokenizer), not the context's 2048 positions.
func TestToyPrompts(t *testing.T) {
	cfg, err := config.Load("../../configs/toy-math-team.yaml", []string{"models.0.tokenizer=../../configs/toy/tokenizer.json",
		"models.1.tokenizer=../../configs/toy/tokenizer.json"})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Build(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, v := pl.Models[0], pl.Models[1]
	if s.PromptBound != boundToy || v.PromptBound != boundToy || s.PromptTokens < 4 || v.PromptTokens < 4 ||
		s.PromptTokens > 64 || v.PromptTokens > 64 || s.ResponseTokens != 6 {
		t.Errorf("toy prompts: solver %d (%s), verifier %d (%s)", s.PromptTokens, s.PromptBound, v.PromptTokens, v.PromptBound)
	}
}

func TestParseMemory(t *testing.T) {
	got, err := ParseMemory([]string{"80GB", "cuda:1=24GiB,cpu=512MB", "CUDA=1.5TB"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"": 80e9, "cuda:1": 24 << 30, "cpu": 512e6, "cuda:0": 1.5e12}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q: %d, want %d", k, got[k], v)
		}
	}
	for _, bad := range []string{"", "-1GB", "80 apples", "gpu=8GB", "auto=8GB", "cuda:x=1GB"} {
		if _, err := ParseMemory([]string{bad}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// Probe reads MemAvailable (MemTotal without it, a cgroup limit when lower) and asks nvidia-smi for
// a GPU's total memory, through CUDA_VISIBLE_DEVICES.
func TestProbe(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	defer func(a, b, c string) { meminfoPath, cgroupMaxPath, nvidiaSMI = a, b, c }(meminfoPath, cgroupMaxPath, nvidiaSMI)
	meminfoPath = write("meminfo", "MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n", 0o644)
	cgroupMaxPath = filepath.Join(dir, "none")
	if n, src, err := Probe("cpu"); err != nil || n != 20000000*1024 || !strings.HasPrefix(src, "MemAvailable") {
		t.Errorf("cpu: %d %q %v", n, src, err)
	}
	cgroupMaxPath = write("memory.max", "8000000000\n", 0o644)
	if n, src, err := Probe("cpu"); err != nil || n != 8e9 || src != "cgroup memory.max" {
		t.Errorf("cpu in a cgroup: %d %q %v", n, src, err)
	}
	cgroupMaxPath = write("memory.max", "max\n", 0o644)
	meminfoPath = write("meminfo", "MemTotal:       24000000 kB\n", 0o644)
	if n, src, err := Probe("cpu"); err != nil || n != 24000000*1024 || !strings.HasPrefix(src, "MemTotal") {
		t.Errorf("cpu without MemAvailable: %d %q %v", n, src, err)
	}
	// A stand-in nvidia-smi that answers for the device -i names.
	nvidiaSMI = write("nvidia-smi", "#!/bin/sh\nfor a; do last=$a; done\ncase $last in 3) echo 81559;; GPU-abc) echo 143771;; *) echo 'No devices were found' >&2; exit 6;; esac\n", 0o755)
	t.Setenv("CUDA_VISIBLE_DEVICES", "3,GPU-abc")
	if n, _, err := Probe("cuda:0"); err != nil || n != 81559<<20 {
		t.Errorf("cuda:0 (GPU 3): %d %v", n, err)
	}
	if n, _, err := Probe("cuda:1"); err != nil || n != 143771<<20 {
		t.Errorf("cuda:1 (GPU-abc): %d %v", n, err)
	}
	if _, _, err := Probe("cuda:2"); err == nil {
		t.Error("cuda:2 with two visible devices: no error")
	}
	t.Setenv("CUDA_VISIBLE_DEVICES", "5")
	if _, _, err := Probe("cuda:0"); err == nil || !strings.Contains(err.Error(), "No devices") {
		t.Errorf("nvidia-smi failing: %v", err)
	}
}

// Sharded training (dist.shard): each rank's master weights and AdamW moments are its partition
// (the largest rank's, from Balance), under gradients its gradients between updates too; data
// parallelism adds the reduction's buffers to the update. Optimizer alone saves about 12 bytes × P
// × (1 − 1/N) per rank for half weights (master 4 + moments 8).
func TestPlanSharded(t *testing.T) {
	one, err := Build(smallRun(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := one.Models[0]
	shapes, _ := arch.Shapes(m.in.cfg)
	sizes := make([]int64, len(shapes))
	for i, w := range shapes {
		sizes[i] = w.Numel()
	}
	_, load := Balance(sizes, 4)
	own := slices.Max(load)
	if own >= m.Params/2 || own < m.Params/4 {
		t.Fatalf("largest partition of 4: %d of %d elements", own, m.Params)
	}
	for _, stage := range []string{"none", "optimizer", "gradients"} {
		cfg := smallRun(t)
		cfg.Dist.Shard = stage
		pl, err := Build(cfg, Options{WorldSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		s := pl.Models[0]
		e := m.Weights / m.Params
		wantOpt, wantGrad, wantReduce, wantMaster := m.Params*8, m.Params*e, m.Params*e, m.Master
		switch stage {
		case "optimizer":
			wantOpt = own * 8
		case "gradients":
			wantOpt, wantGrad, wantReduce = own*8, own*e, m.Params*e+(m.Params-own)*e
		}
		if stage != "none" && m.Master > 0 {
			wantMaster = own * 4
		}
		if s.Optimizer != wantOpt || s.Gradients != wantGrad || s.Master != wantMaster || s.Weights != m.Weights {
			t.Errorf("%s: optimizer %d (want %d), gradients %d (want %d), master %d (want %d), weights %d", stage, s.Optimizer, wantOpt, s.Gradients, wantGrad, s.Master, wantMaster, s.Weights)
		}
		if s.Reduce < wantReduce || s.Update != max(s.Activations+s.Attention+s.Logits, s.OptimStep)+s.Reduce {
			t.Errorf("%s: reduce %d (want ≥ %d), update %d", stage, s.Reduce, wantReduce, s.Update)
		}
		if pl.WorldSize != 4 || pl.Shard != stage {
			t.Errorf("%s: plan for %d ranks, shard %q", stage, pl.WorldSize, pl.Shard)
		}
		t.Logf("%s, 4 ranks: static %d, update %d (one process: static %d, update %d)", stage, s.Static, s.Update, m.Static, m.Update)
	}
}

// models[].optim.offload: cpu moves a GPU model's master weights and AdamW moments (its partition
// under dist.shard) and its AdamW step from the GPU's figures to the host's, which exists in the plan
// even when no model runs on the CPU; on a CPU model the state stays where it is and only the float32
// master copy of float32 weights is new.
func TestPlanOffload(t *testing.T) {
	for _, world := range []int{1, 2} {
		opt := Options{WorldSize: world, HostRanks: world}
		sets := []string{"models.0.device=cuda:0", "dist.shard=optimizer"}
		on, err := Build(smallRun(t, append(sets, "models.0.optim.offload=cpu")...), opt)
		if err != nil {
			t.Fatal(err)
		}
		off, err := Build(smallRun(t, sets...), opt)
		if err != nil {
			t.Fatal(err)
		}
		a, b := off.Models[0], on.Models[0]
		own := a.Optimizer / 8
		if world == 1 && own != a.Params || world == 2 && own >= a.Params {
			t.Fatalf("%d ranks: optimizer partition %d of %d parameters", world, own, a.Params)
		}
		if b.Master != 0 || b.Optimizer != 0 || b.OptimStep != 0 || b.Offloaded != own*12 || b.OffloadStep != a.OptimStep*4/3 ||
			b.Weights != a.Weights || b.Gradients != a.Gradients || b.Activations != a.Activations {
			t.Errorf("%d ranks: offloaded model parts %+v, without offload %+v", world, b.Parts, a.Parts)
		}
		if len(off.Devices) != 1 || len(on.Devices) != 2 {
			t.Fatalf("%d ranks: %d devices without offload, %d with; want 1 and 2 (the host)", world, len(off.Devices), len(on.Devices))
		}
		gpu, host := on.Devices[1], on.Devices[0]
		if gpu.Device != "cuda:0" || host.Device != "cpu" || host.Ranks != world {
			t.Fatalf("%d ranks: devices %s, %s (%d ranks)", world, gpu.Device, host.Device, host.Ranks)
		}
		if d := off.Devices[0]; gpu.Static != d.Static-own*12 || gpu.OptimStep != 0 || gpu.Update != gpu.Activations+gpu.Attention+gpu.Logits+gpu.Reduce {
			t.Errorf("%d ranks: GPU static %d, update %d; without offload %d, %d", world, gpu.Static, gpu.Update, d.Static, d.Update)
		}
		if host.Offloaded != own*12 || host.Static != own*12 || host.Update != b.OffloadStep || host.Rollout != 0 ||
			host.PeakBytes != int64(world)*(own*12+b.OffloadStep+CPUOverhead) {
			t.Errorf("%d ranks: host parts %+v, peak %d", world, host.Parts, host.PeakBytes)
		}
		var out strings.Builder
		if err := on.Write(&out); err != nil || !strings.Contains(out.String(), "offloaded optimizer") || !strings.Contains(out.String(), "m (offloaded optimizer)") {
			t.Errorf("plan text lacks the offloaded state:\n%s", out.String())
		}
		on.Capacities(Options{Memory: map[string]int64{"": 1 << 50, "cpu": CPUOverhead}})
		if _, err := on.Check(); err == nil || !strings.Contains(err.Error(), "cpu needs") || !strings.Contains(err.Error(), "models[0].optim.offload (cpu)") {
			t.Errorf("%d ranks: host too small: err %v, want one naming models[0].optim.offload", world, err)
		}
	}
	// On the CPU: a float32 model gains the host master copy; the moments stay.
	cpuOff, err := Build(smallRun(t, "models.0.dtype=float32"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	cpuOn, err := Build(smallRun(t, "models.0.dtype=float32", "models.0.optim.offload=cpu"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := cpuOff.Models[0], cpuOn.Models[0]
	if a.Master != 0 || b.Master != a.Params*4 || b.Optimizer != a.Optimizer || b.Offloaded != 0 || len(cpuOn.Devices) != 1 ||
		cpuOn.Devices[0].Static != cpuOff.Devices[0].Static+a.Params*4 {
		t.Errorf("CPU model: parts %+v with offload, %+v without", b.Parts, a.Parts)
	}
}

// Under a token budget a micro-batch is planned as the rows of the longest length that the budget
// holds (at least one: a longer call is a micro-batch of its own), and the logits as every response
// token of them — not micro_batch_size sequences.
func TestPlanTokenBudget(t *testing.T) {
	const T, e = 96, 2
	for _, c := range []struct {
		budget string
		rows   int64 // rows of T tokens the budget holds
		logits int64 // response tokens in the logits
	}{{"200", 3, 200}, {"50", 1, T}, {"960", 10, 960}} {
		pl, err := Build(smallRun(t, "algorithm.max_tokens_per_micro_batch="+c.budget), Options{Device: "cuda"})
		if err != nil {
			t.Fatal(err)
		}
		mp := pl.Models[0].Parts
		perLayer := c.rows * T * (ActHidden*64 + ActIntermediate*128 + ActAttention*(4+2*2)*16) * e
		if mp.Activations != 3*perLayer || mp.Attention != 4*c.rows*4*T*T*4 || mp.Logits != c.logits*100*4*3 {
			t.Errorf("budget %s: activations %d, attention %d, logits %d; want %d, %d, %d", c.budget, mp.Activations, mp.Attention, mp.Logits,
				3*perLayer, 4*c.rows*4*T*T*4, c.logits*100*4*3)
		}
	}
}

// The rollout's KV cache is planned for the generation budget: rollout.max_batch slots of up to 2T
// columns when the call's rows do not all fit at once (continuous batching), capped by
// rollout.kv_tokens down to the one row that always runs — not every row of the call at T.
func TestPlanGenerationBudget(t *testing.T) {
	const T, e, rows = 96, 2, 4 * 2
	perPos := int64(2 * 2 * 2 * 16 * e) // K, V × layers × kv heads × head dim × e
	for _, c := range []struct {
		maxBatch  int
		kvTokens  int64
		positions int64
	}{
		{0, 0, rows * T},       // every row at once
		{8, 0, rows * T},       // max_batch holds the call: a static batch
		{3, 0, 3 * 2 * T},      // 3 slots, rows of different ages: up to 2T columns
		{0, 500, 500},          // the KV budget
		{3, 400, 400},          // both: the smaller
		{2, 10_000, 2 * 2 * T}, // a budget above the slots' need changes nothing
		{0, 50, T},             // a budget below one row: the row still runs
	} {
		cfg := smallRun(t)
		cfg.Models[0].Rollout.MaxBatch, cfg.Models[0].Rollout.KVTokens = c.maxBatch, c.kvTokens
		pl, err := Build(cfg, Options{Device: "cuda"})
		if err != nil {
			t.Fatal(err)
		}
		m := pl.Models[0]
		if want := perPos * c.positions; m.RolloutKV != want || m.Rollout != want+m.DecodeCopy {
			t.Errorf("max_batch %d, kv_tokens %d: rollout KV %d (rollout %d), want %d (%d positions)", c.maxBatch, c.kvTokens, m.RolloutKV, m.Rollout, want, c.positions)
		}
		if c.maxBatch > 0 && !slices.ContainsFunc(m.keys, func(k string) bool { return strings.Contains(k, "rollout.max_batch") }) {
			t.Errorf("max_batch %d: keys %v do not name rollout.max_batch", c.maxBatch, m.keys)
		}
	}
}

// With rollouts ahead of training (rollout.max_staleness K) the host holds K rollouts: batch × group
// trajectories, each agent called up to max_loop_num times (math), each call its model's prompt and
// response bound, heldTokenBytes per token — worked out by hand; the peak grows by exactly that.
func TestPlanRolloutsAhead(t *testing.T) {
	sync, err := Build(smallRun(t), Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Build(smallRun(t, "rollout.max_staleness=3", "models.0.rollout={engine: sglang, urls: [\"http://127.0.0.1:1\"]}"), Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	base, err := Build(smallRun(t, "models.0.rollout={engine: sglang, urls: [\"http://127.0.0.1:1\"]}"), Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	// 3 rollouts × 4 × 2 trajectories × 2 agents × 2 calls (max_loop_num) × (64 + 32) tokens × 24 bytes.
	const want = 3 * 4 * 2 * 2 * 2 * (64 + 32) * heldTokenBytes
	if d := pl.Devices[0]; d.Ahead != want || d.PeakBytes-base.Devices[0].PeakBytes != want {
		t.Errorf("rollouts ahead %d (peak %d against %d without), want %d more", d.Ahead, d.PeakBytes, base.Devices[0].PeakBytes, want)
	}
	if sync.Devices[0].Ahead != 0 {
		t.Errorf("a synchronous run plans %d bytes of rollouts ahead", sync.Devices[0].Ahead)
	}
}

// GPUName asks nvidia-smi for the name of the GPU CUDA_VISIBLE_DEVICES maps cuda:N to.
func TestGPUName(t *testing.T) {
	defer func(c string) { nvidiaSMI = c }(nvidiaSMI)
	nvidiaSMI = filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(nvidiaSMI, []byte("#!/bin/sh\necho \"$1 of $4\"\necho second line\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CUDA_VISIBLE_DEVICES", "2,7")
	if got, err := GPUName("cuda:1"); err != nil || got != "--query-gpu=name of 7" {
		t.Errorf("GPUName(cuda:1) = %q, %v", got, err)
	}
	if _, err := GPUName("cpu"); err == nil {
		t.Error("GPUName(cpu): no error")
	}
}

// The allocator's terms on real shapes (Qwen3-0.6B, float32, 2 × (512 + 128): drmas bench's step).
// Every activation tensor ([2, 640, width] float32, at most 15.7 MB) and attention tile comes from
// the C heap, which holds them after backward; the logits chunk ([256, 151,936] float32, 155.6 MB)
// is mapped and given back. AdamW's float32 scratch for the embedding (3 × 622 MB) is mapped too:
// the optimizer step's peak is the held heap plus that scratch, above backward's. On CUDA nothing is
// held (its caching allocator is not glibc's).
func TestPlanHeldHeap(t *testing.T) {
	c, err := arch.ReadConfig("../../configs/models/qwen3-0.6b.json")
	if err != nil {
		t.Fatal(err)
	}
	const e, B, T, R = 4, 2, 640, 128
	s := Step(c, e, B, T, R, false, true)
	h, I, q, kv := int64(B*T*1024*e), int64(B*T*3072*e), int64(B*T*16*128*e), int64(B*T*8*128*e)
	perLayer := ActHidden*h + ActIntermediate*I + ActAttention*(q+2*kv)
	if I > HeapBlockMax || s.Activations != 29*perLayer {
		t.Fatalf("activations %d, want 29 × %d (the intermediate tensor, %d bytes, under %d)", s.Activations, perLayer, I, HeapBlockMax)
	}
	if want := s.Activations + s.Attention; s.UpdateHeap != want || s.Held != want || s.Logits != 3*256*151936*4 {
		t.Errorf("update heap %d (held %d), want activations + attention %d (logits %d, mapped, not held)", s.UpdateHeap, s.Held, want, s.Logits)
	}
	if embed := int64(151936 * 1024); s.OptimStep != 3*4*embed || s.StepMapped != s.OptimStep {
		t.Errorf("optimizer step %d on held %d, want both 3·4·%d", s.OptimStep, s.StepMapped, embed)
	}
	if want := s.UpdateHeap + s.StepMapped; s.Update != want || want <= s.Activations+s.Attention+s.Logits {
		t.Errorf("update %d, want held + step %d (above backward's %d)", s.Update, want, s.Activations+s.Attention+s.Logits)
	}
	// Longer rows: the [1, 16,384, 3,072] float32 intermediate tensor (201 MB) is mapped, not held.
	long := Step(c, e, 1, 16384, 128, false, true)
	if hl := int64(29 * (ActHidden + ActAttention*(16+2*8)*128/1024) * 16384 * 1024 * e); long.UpdateHeap >= hl+long.Attention+1 || long.UpdateHeap == 0 {
		t.Errorf("update heap %d at 16,384 tokens: want at most the h- and q/k/v-sized tensors (%d) plus attention", long.UpdateHeap, hl)
	}
	if g := Step(c, 2, B, T, R, false, false); g.Held != 0 || g.StepMapped != 0 || g.heldPhases() != 0 {
		t.Errorf("CUDA: held %d, step mapped %d; want 0", g.Held, g.StepMapped)
	}
}

// The plan is made before anything is loaded, and for other machines: it needs no libtorch. Its
// allocator figures mirror pkg/torch's (HeapBlockMax; pkg/torch's tests hold the two equal) rather
// than import it.
func TestNoTorchDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/drmas/drmas/pkg/policy" || dep == "github.com/drmas/drmas/pkg/torch" || strings.HasPrefix(dep, "github.com/sugarme/gotch") {
			t.Errorf("pkg/plan depends on %s", dep)
		}
	}
}
