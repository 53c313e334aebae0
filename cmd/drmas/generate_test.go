package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/bench"
	"github.com/drmas/drmas/pkg/llm"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
	"github.com/drmas/drmas/pkg/torch"
)

// execDrmas runs the root command with args and returns stdout, stderr and the error.
func execDrmas(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"--log-level", "error", "--device", "cpu"}, args...))
	err := root.Execute()
	return out.String(), errOut.String(), err
}

// toyModelDir writes a toy folder (config.json, model.safetensors, tokenizer.json only) and returns
// it with the policy it holds.
func toyModelDir(t *testing.T) (string, *policy.Policy) {
	t.Helper()
	dir := t.TempDir()
	tok := tokenizer.NewCharLevel([]string{"<answer>", "</answer>"}, nil)
	chat, err := tokenizer.BuiltinChatTemplate(tokenizer.TemplateChatML, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := arch.Config{ModelType: arch.Qwen2, HiddenSize: 32, IntermediateSize: 64, NumHiddenLayers: 2,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, VocabSize: tok.VocabSize(), TieWordEmbeddings: true,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 128, InitializerRange: 0.5, HiddenAct: "silu", TorchDType: "float32"}
	var p *policy.Policy
	err = torch.Do(func() error {
		m, err := policy.NewRandom(cfg, gotch.CPU, gotch.Float, 3)
		if err != nil {
			return err
		}
		if p, err = policy.NewPolicy("toy", m, tok, chat); err != nil {
			return err
		}
		return p.Save(dir)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir, p
}

func TestGenerateCommand(t *testing.T) {
	dir, p := toyModelDir(t)
	out, _, err := execDrmas(t, "generate", "--model", dir, "--prompt-ids", "10,72,105", "--max-new-tokens", "6",
		"--temperature", "0", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got generateResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	want, err := p.GenerateIDs(context.Background(), [][]int{{10, 72, 105}}, []llm.Sampling{{MaxNewTokens: 6}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.PromptIDs, []int{10, 72, 105}) || !slices.Equal(got.ResponseIDs, want[0].ResponseIDs) ||
		len(got.LogProbs) != len(got.ResponseIDs) || got.Finish != want[0].Finish || got.Text != want[0].Text {
		t.Fatalf("generate --json = %+v, the policy itself gives %+v", got, want[0])
	}

	// A text prompt goes through the chat template; stdout carries the text only.
	out, _, err = execDrmas(t, "generate", "--model", dir, "--prompt", "Hi", "--system", "Be brief.",
		"--max-new-tokens", "4", "--seed", "3")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []llm.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	direct, err := p.Generate(context.Background(), []llm.Request{{Messages: msgs, Sampling: llm.Sampling{Temperature: 1, TopP: 1, MaxNewTokens: 4, Seed: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if out != direct[0].Text+"\n" {
		t.Fatalf("generate --prompt printed %q, want %q", out, direct[0].Text+"\n")
	}
}

// top_p 0 means off, as in a config's sampling section (one owner: llm.Sampling.Check).
func TestGenerateTopPZero(t *testing.T) {
	dir, _ := toyModelDir(t)
	if _, _, err := execDrmas(t, "generate", "--model", dir, "--prompt-ids", "1,2", "--top-p", "0", "--max-new-tokens", "2"); err != nil {
		t.Errorf("--top-p 0: %v", err)
	}
}

func TestGenerateCommandBadInput(t *testing.T) {
	dir, _ := toyModelDir(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", dir}, "exactly one of --prompt and --prompt-ids"},
		{[]string{"--model", dir, "--prompt", "a", "--prompt-ids", "1"}, "exactly one"},
		{[]string{"--model", dir, "--prompt-ids", "1,x"}, `"x" is not a token id`},
		{[]string{"--model", dir, "--prompt-ids", "1", "--top-p", "2"}, "--top-p"},
		{[]string{"--model", dir, "--prompt-ids", "1", "--max-new-tokens", "0"}, "--max-new-tokens"},
		{[]string{"--model", dir, "--prompt-ids", "99999"}, "99999"},
		{[]string{"--model", dir, "--prompt-ids", "1", "--max-new-tokens", "100000000"}, "--max-new-tokens: must be in [1, 1048576]"},
		{[]string{"--model", dir, "--prompt-ids", "1,2,3", "--max-new-tokens", "126"}, "exceeds the model's max_position_embeddings 128"},
		{[]string{"--model", dir, "--prompt-ids", "1", "--temperature", "NaN"}, "--temperature"},
		{[]string{"--model", t.TempDir(), "--prompt", "a"}, "tokenizer.json"},
		{[]string{"--prompt", "a"}, "--model is required"},
	} {
		_, _, err := execDrmas(t, append([]string{"generate"}, tc.args...)...)
		var ue usageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("generate %v: err = %v, want a usage error (exit 2) mentioning %q", tc.args, err, tc.want)
		}
	}
}

// NaN weights give an error, never NUL bytes with exit 0.
func TestGenerateNaNWeights(t *testing.T) {
	_, p := toyModelDir(t)
	err := torch.Do(func() error {
		return torch.NoGrad(func() error {
			p.Model.Parameters()[0].T.MustFill_(ts.FloatScalar(math.NaN()))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	comps, err := p.GenerateIDs(context.Background(), [][]int{{1, 2, 3}}, []llm.Sampling{{Temperature: 0, MaxNewTokens: 4}})
	if err == nil || !strings.Contains(err.Error(), "not finite") {
		t.Fatalf("generate with NaN weights: %+v, err %v; want an error about non-finite logits", comps, err)
	}
}

// --dtype auto: float32 on the CPU; on CUDA the model folder's torch_dtype, bfloat16 for a preset;
// an explicit dtype is kept.
func TestAutoDType(t *testing.T) {
	dir := t.TempDir()
	cfg, err := bench.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.TorchDType = "float16"
	js, err := cfg.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	cuda := gotch.CudaBuilder(0)
	for _, c := range []struct {
		name string
		dt   gotch.DType
		dev  gotch.Device
		dir  string
		want gotch.DType
	}{
		{"cpu folder", gotch.Invalid, gotch.CPU, dir, gotch.Float},
		{"cpu preset", gotch.Invalid, gotch.CPU, "", gotch.Float},
		{"cuda folder", gotch.Invalid, cuda, dir, gotch.Half},
		{"cuda preset", gotch.Invalid, cuda, "", gotch.BFloat16},
		{"explicit", gotch.Double, cuda, dir, gotch.Double},
	} {
		if got, err := autoDType(c.dt, c.dev, c.dir); err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := autoDType(gotch.Invalid, cuda, t.TempDir()); err == nil {
		t.Error("a CUDA model folder without config.json: no error")
	}
}
