package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/arch"
)

// bench on a toy model folder: the figures describe that model and that workload, every timing is a
// finite number, the folder is left as it was. (Timings themselves are not asserted: they are noise
// on a shared machine.)
func TestBenchCommand(t *testing.T) {
	dir, p := toyModelDir(t)
	weights := filepath.Join(dir, "model.safetensors")
	before, err := os.ReadFile(weights)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := execDrmas(t, "bench", "--model", dir, "--batch", "2", "--prompt-len", "4", "--response-len", "3", "--steps", "1", "--matmul-size", "128", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got benchOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	c := p.Model.Config
	if got.Params != c.NumParams() || got.ModelType != "qwen2" || got.Hidden != c.HiddenSize || got.Layers != c.NumHiddenLayers ||
		got.Batch != 2 || got.PromptLen != 4 || got.ResponseLen != 3 || got.Device != "cpu" || got.DType != "float32" || got.Threads < 1 {
		t.Errorf("bench --json describes %+v; want the toy model (%d params, hidden %d, %d layers), batch 2, 4+3 tokens, float32 on cpu",
			got, c.NumParams(), c.HiddenSize, c.NumHiddenLayers)
	}
	for name, v := range map[string]float64{"matmul_gflops": got.MatmulGFLOPS, "train_ms_per_step": got.TrainMsPerStep,
		"train_tokens_per_s": got.TrainTokensPerSec, "train_gflops": got.TrainGFLOPS, "gen_seconds": got.GenSeconds,
		"gen_tokens_per_s": got.GenTokensPerSec, "decode_ms_per_step": got.DecodeMsPerStep, "gen_gflops": got.GenGFLOPS} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("%s = %v, want a finite figure", name, v)
		}
	}
	if after, err := os.ReadFile(weights); err != nil || !bytes.Equal(before, after) {
		t.Errorf("bench changed the model folder's weights (err %v)", err)
	}
	out, _, err = execDrmas(t, "bench", "--model", dir, "--batch", "1", "--prompt-len", "2", "--response-len", "2", "--steps", "1", "--matmul-size", "128")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hidden 32, 2 layers", "float32 on cpu", "128² float32", "train step", "1×(2+2) tokens", "ms/step",
		"generation", "1×2 tokens after 2-token prompts", "tokens/s", "GFLOP/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench table lacks %q:\n%s", want, out)
		}
	}
}

// --response-lengths, --micro-batch, --max-tokens-per-micro-batch and --pack: the step is cut as asked and
// reports its micro-batches and their padding.
func TestBenchMicroBatches(t *testing.T) {
	dir, _ := toyModelDir(t)
	args := []string{"bench", "--model", dir, "--batch", "4", "--prompt-len", "2", "--response-lengths", "8,1", "--steps", "1",
		"--warmup-steps", "0", "--matmul-size", "64", "--no-generate", "--json"}
	for _, c := range []struct {
		flags   []string
		mbs     int
		padding float64
	}{
		{nil, 1, 1 - 26.0/40},                                            // one micro-batch of 4 rows × 10
		{[]string{"--micro-batch", "2"}, 2, 1 - 26.0/40},                 // (10, 3) twice: padded to 10 each
		{[]string{"--max-tokens-per-micro-batch", "20"}, 2, 0},           // the two 10s, then the two 3s
		{[]string{"--max-tokens-per-micro-batch", "5"}, 4, 0},            // every row alone (10 > 5; 2 × 3 > 5)
		{[]string{"--max-tokens-per-micro-batch", "13", "--pack"}, 2, 0}, // packed rows of a 10 and a 3
	} {
		out, _, err := execDrmas(t, append(args, c.flags...)...)
		if err != nil {
			t.Fatal(err)
		}
		var got benchOutput
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("--json output %q: %v", out, err)
		}
		if got.MicroBatches != c.mbs || math.Abs(got.TrainPadding-c.padding) > 1e-12 || got.TrainRealTokens != 26 ||
			!(got.TrainMsPerStep > 0) || !(got.TrainCPUMsPerStep > 0) {
			t.Errorf("%v: %d micro-batches, padding %g, %d tokens, %g ms (%g CPU ms); want %d, %g, 26",
				c.flags, got.MicroBatches, got.TrainPadding, got.TrainRealTokens, got.TrainMsPerStep, got.TrainCPUMsPerStep, c.mbs, c.padding)
		}
	}
}

func TestBenchCommandBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch", "2"}, "exactly one of --model, --preset and --config"},
		{[]string{"--preset", "tiny", "--config", "x.json"}, "exactly one of --model, --preset and --config"},
		{[]string{"--config", "/nonexistent/config.json"}, "config.json"},
		{[]string{"--preset", "huge"}, `preset "huge"`},
		{[]string{"--preset", "tiny", "--batch", "0"}, "--batch 0"},
		{[]string{"--model", t.TempDir()}, "config.json"},
		{[]string{"--model", t.TempDir(), "--save-model", t.TempDir()}, "--save-model needs --preset"},
		{[]string{"--preset", "tiny", "--lora", "2", "--lora-targets", "all-linear,norm"}, `--lora-targets: target_modules: "norm"`},
		{[]string{"--preset", "tiny", "--response-lengths", "4,0"}, "--response-lengths [4 0]: every length must be > 0"},
		{[]string{"--preset", "tiny", "--max-tokens-per-micro-batch", "-1"}, "must be ≥ 0"},
		{[]string{"--preset", "tiny", "--pack"}, "--pack needs --max-tokens-per-micro-batch"},
		{[]string{"--preset", "tiny", "--lora", "1", "--micro-batch", "2"}, "not --lora's"},
	} {
		_, _, err := execDrmas(t, append([]string{"bench"}, tc.args...)...)
		var ue usageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: err = %v, want a usage error mentioning %q", tc.args, err, tc.want)
		}
	}
}

// --save-model writes the preset as a model folder that bench (and scripts/bench_torch.py) loads:
// benchmarking the folder then describes the same model.
func TestBenchSaveModel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	args := []string{"--batch", "1", "--prompt-len", "2", "--response-len", "2", "--steps", "1", "--matmul-size", "64", "--json"}
	out, _, err := execDrmas(t, append([]string{"bench", "--preset", "tiny", "--save-model", dir}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var saved, loaded benchOutput
	if err := json.Unmarshal([]byte(out), &saved); err != nil {
		t.Fatal(err)
	}
	out, _, err = execDrmas(t, append([]string{"bench", "--model", dir}, args...)...)
	if err != nil {
		t.Fatalf("bench on the saved folder: %v", err)
	}
	if err := json.Unmarshal([]byte(out), &loaded); err != nil {
		t.Fatal(err)
	}
	if loaded.Params != saved.Params || loaded.Hidden != 256 || loaded.Layers != 4 || loaded.ModelType != "qwen2" {
		t.Errorf("saved preset benchmarks as %+v, want the tiny preset (%d params)", loaded, saved.Params)
	}
}

// bench --lora trains adapters on the frozen model: their size follows --lora-rank and
// --lora-targets (embed_tokens and lm_head add r·(vocab + hidden) each to every projection's).
func TestBenchLoRATargets(t *testing.T) {
	dir, p := toyModelDir(t)
	c := p.Model.Config
	params := func(targets string) int64 {
		t.Helper()
		out, _, err := execDrmas(t, "bench", "--model", dir, "--batch", "1", "--prompt-len", "3", "--response-len", "2", "--steps", "1",
			"--matmul-size", "64", "--no-generate", "--lora", "2", "--lora-rank", "4", "--lora-targets", targets, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Adapters int   `json:"lora_adapters"`
			Params   int64 `json:"adapter_params"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || got.Adapters != 2 {
			t.Fatalf("--json output %q: %v", out, err)
		}
		return got.Params
	}
	linear, all := params("all-linear"), params("all-linear,embed_tokens,lm_head")
	want, err := arch.LoRAParams(c, 4, []string{arch.LoRAAllLinear})
	if err != nil {
		t.Fatal(err)
	}
	if linear != want || all != want+2*4*int64(c.VocabSize+c.HiddenSize) {
		t.Errorf("adapter params: all-linear %d (want %d), with embed_tokens and lm_head %d (want %d)", linear, want, all, want+2*4*int64(c.VocabSize+c.HiddenSize))
	}
}

// A benchmark whose memory plan exceeds the machine's memory is refused before it runs, naming what
// fits (#52: --batch 64 with responses up to 1,009 tokens grew to 24 GB and was killed by the kernel).
func TestBenchRefusesAPlanThatDoesNotFit(t *testing.T) {
	_, _, err := execDrmas(t, "bench", "--preset", "tiny", "--batch", "65536", "--prompt-len", "2048", "--response-len", "2048", "--steps", "1", "--no-generate")
	var bad usageError
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), "the benchmark's memory plan needs") ||
		!strings.Contains(err.Error(), "it fits with") || !strings.Contains(err.Error(), "--micro-batch") {
		t.Fatalf("err = %v, want the plan refused with the micro-batch that fits", err)
	}
}
