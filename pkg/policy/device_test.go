package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/torch"
)

// The device tests run the golden logits, generation, a training step and a memory check on the
// device named by DRMAS_TEST_DEVICE (cuda, cuda:1, cpu); without it they skip. scripts/device-check.sh
// runs them on a GPU machine (DEVICE=cpu dry-runs them here):
//
//	DRMAS_TEST_DEVICE=cuda go test ./pkg/policy -run TestDevice -v

// testDevice returns the device under test, or skips.
func testDevice(t *testing.T) gotch.Device {
	t.Helper()
	name := os.Getenv("DRMAS_TEST_DEVICE")
	if name == "" {
		t.Skip("set DRMAS_TEST_DEVICE=cuda (or cpu) to run the device tests")
	}
	dev, err := torch.ParseDevice(name)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// Golden-logit tolerances on a device: float32 within 1e-3 of PyTorch's float32 reference (CUDA
// kernels sum in another order than the CPU); bfloat16 (8 bits of mantissa in the weights and
// activations) within 10% of the largest reference logit, max|Δ| ≤ 0.1·max|ref| (the CPU's bfloat16
// measured 0.024–0.035·max|ref| on these models).
const (
	deviceF32Tol     = 1e-3
	deviceBF16RelTol = 0.10
)

func TestDeviceGoldenLogits(t *testing.T) {
	dev := testDevice(t)
	for _, name := range arch.ModelTypes() {
		for _, dt := range []gotch.DType{gotch.Float, gotch.BFloat16} {
			t.Run(name+"-"+DTypeName(dt), func(t *testing.T) {
				dir := filepath.Join("testdata", "golden", name)
				data, err := os.ReadFile(filepath.Join(dir, "logits.json"))
				if err != nil {
					t.Fatal(err)
				}
				var golden struct {
					IDs    [][]int       `json:"ids"`
					Logits [][][]float64 `json:"logits"`
				}
				if err := json.Unmarshal(data, &golden); err != nil {
					t.Fatal(err)
				}
				onTorch(t, func() error {
					m, err := Load(dir, dev, dt)
					if err != nil {
						return err
					}
					got := values(m.Forward(idsTensor(golden.IDs...).MustTo(dev, true), nil, nil, nil))
					V := m.Config.VocabSize
					worst, scale := 0.0, 0.0
					for _, row := range golden.Logits {
						for _, pos := range row {
							for _, want := range pos {
								scale = max(scale, math.Abs(want))
							}
						}
					}
					for b, row := range golden.Logits {
						for i, pos := range row {
							for v, want := range pos {
								g := got[(b*len(row)+i)*V+v]
								d := math.Abs(g - want)
								worst = max(worst, d)
								tol := deviceF32Tol
								if dt == gotch.BFloat16 {
									tol = deviceBF16RelTol * scale
								}
								if d > tol || math.IsNaN(g) {
									return fmt.Errorf("logits[%d][%d][%d] = %.6f on %s, PyTorch reference %.6f (tolerance %.2g)",
										b, i, v, g, torch.DeviceString(dev), want, tol)
								}
							}
						}
					}
					t.Logf("%s %s: max |Δ| vs PyTorch %.2g (%.3f of max|ref| %.2f)", torch.DeviceString(dev), DTypeName(dt), worst, worst/scale, scale)
					return nil
				})
			})
		}
	}
}

// Greedy generation on the device gives the CPU's tokens (float32), and sampled generation runs.
func TestDeviceGenerate(t *testing.T) {
	dev := testDevice(t)
	dir := filepath.Join("testdata", "golden", arch.Qwen3)
	prompts := [][]int{{1, 5, 9, 17}, {7, 11, 3, 30, 2, 8}}
	gen := func(d gotch.Device, temp float64) [][]int {
		var m *Model
		onTorch(t, func() error {
			var err error
			m, err = Load(dir, d, gotch.Float)
			return err
		})
		p := &Policy{ID: "g", Model: m, Device: d}
		s := []llm.Sampling{{Temperature: temp, MaxNewTokens: 12, Seed: 1}, {Temperature: temp, MaxNewTokens: 12, Seed: 2}}
		comps, err := p.GenerateIDs(context.Background(), prompts, s)
		if err != nil {
			t.Fatal(err)
		}
		out := make([][]int, len(comps))
		for i, c := range comps {
			out[i] = c.ResponseIDs
			for _, lp := range c.LogProbs {
				if math.IsNaN(float64(lp)) || lp > 0 {
					t.Fatalf("row %d: log-prob %v", i, lp)
				}
			}
		}
		return out
	}
	onDev, onCPU := gen(dev, 0), gen(gotch.CPU, 0)
	for i := range onDev {
		if !slices.Equal(onDev[i], onCPU[i]) {
			t.Errorf("row %d: greedy on %s %v, on cpu %v", i, torch.DeviceString(dev), onDev[i], onCPU[i])
		}
	}
	if s := gen(dev, 1); len(s[0]) == 0 || len(s[1]) == 0 {
		t.Errorf("sampling on %s produced nothing: %v", torch.DeviceString(dev), s)
	}
}

// A few AdamW steps on one batch on the device (the trainer's AdamW, through TrainScore with
// checkpointing) lower its loss, in float32 and bfloat16.
func TestDeviceTrainStep(t *testing.T) {
	dev := testDevice(t)
	for _, dt := range []gotch.DType{gotch.Float, gotch.BFloat16} {
		t.Run(DTypeName(dt), func(t *testing.T) {
			seqs := []Sequence{{PromptIDs: []int{1, 2, 3}, ResponseIDs: []int{4, 5, 6, 7}}, {PromptIDs: []int{9, 8}, ResponseIDs: []int{7, 6, 5}}}
			onTorch(t, func() error {
				m, err := NewRandom(tinyConfig(arch.Qwen3, 64), dev, dt, 1)
				if err != nil {
					return err
				}
				names, params := SplitParams(m.Parameters())
				opt := optim.NewAdamW(names, params, optim.AdamWOptions{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
				defer opt.Free()
				var losses []float64
				for range 6 {
					s := torch.NewScope()
					sc, bp, err := m.TrainScore(seqs, false, true)
					if err != nil {
						s.Close()
						return err
					}
					loss := sc.LogProbs.MustSum(gotch.Invalid, false).MustDiv(sc.Mask.MustSum(gotch.Invalid, false), true).MustNeg(true)
					bp.Backward(loss)
					opt.Apply(opt.CurrentLR())
					for _, p := range params {
						p.MustGrad(false).MustZero_()
					}
					losses = append(losses, loss.Float64Values()[0])
					s.Close()
				}
				if math.IsNaN(losses[5]) || losses[5] >= losses[0] {
					return fmt.Errorf("losses %v on %s %s: want the last below the first", losses, torch.DeviceString(dev), DTypeName(dt))
				}
				t.Logf("losses on %s %s: %.4f → %.4f", torch.DeviceString(dev), DTypeName(dt), losses[0], losses[5])
				return nil
			})
		})
	}
}

// 200 iterations of generate + a training step on the device keep host memory, and the device's
// memory when nvidia-smi can tell it, within 10% (plus 64 MiB) of their value after iteration 50.
func TestDeviceMemoryFlat(t *testing.T) {
	dev := testDevice(t)
	iters := 200
	if n, err := strconv.Atoi(os.Getenv("DRMAS_DEVICE_ITERS")); err == nil && n > 50 {
		iters = n
	}
	c := tinyConfig(arch.Qwen2, 300)
	c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim = 128, 512, 4, 2, 32
	var m *Model
	onTorch(t, func() error {
		var err error
		m, err = NewRandom(c, dev, gotch.Float, 1)
		return err
	})
	p := &Policy{ID: "m", Model: m, Device: dev}
	var host50, dev50, host, devMem int64
	for it := 1; it <= iters; it++ {
		prompts := make([][]int, 8)
		s := make([]llm.Sampling, 8)
		for i := range prompts {
			for j := range 3 + (it+i)%9 {
				prompts[i] = append(prompts[i], 1+(it*7+i*3+j)%290)
			}
			s[i] = llm.Sampling{Temperature: 1, TopP: 0.9, MaxNewTokens: 6 + i%8, Seed: int64(it*8 + i)}
		}
		comps, err := p.GenerateIDs(context.Background(), prompts, s)
		if err != nil {
			t.Fatal(err)
		}
		seqs := make([]Sequence, len(comps))
		for i, c := range comps {
			seqs[i] = Sequence{PromptIDs: prompts[i], ResponseIDs: c.ResponseIDs}
		}
		onTorch(t, func() error { return trainStep(m, seqs, 1e-3) })
		torch.ReleaseMemory()
		host, devMem = torch.ResidentBytes(), gpuMemory(dev)
		if it == 50 {
			host50, dev50 = host, devMem
		}
	}
	t.Logf("%s: host resident %.1f → %.1f MiB, device %.1f → %.1f MiB (iteration 50 → %d)", torch.DeviceString(dev),
		float64(host50)/(1<<20), float64(host)/(1<<20), float64(dev50)/(1<<20), float64(devMem)/(1<<20), iters)
	grew := func(a, b int64) bool { return float64(b) > 1.10*float64(a)+64<<20 }
	if grew(host50, host) || grew(dev50, devMem) {
		t.Fatalf("memory grew by more than 10%% + 64 MiB: host %d → %d KiB, device %d → %d KiB", host50>>10, host>>10, dev50>>10, devMem>>10)
	}
}

// gpuMemory is the device memory this process holds according to nvidia-smi, or 0 (CPU, or no
// nvidia-smi).
func gpuMemory(dev gotch.Device) int64 {
	if !dev.IsCuda() {
		return 0
	}
	out, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return 0
	}
	pid := strconv.Itoa(os.Getpid())
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) == 2 && strings.TrimSpace(f[0]) == pid {
			mb, _ := strconv.ParseInt(strings.TrimSpace(f[1]), 10, 64)
			return mb << 20
		}
	}
	return 0
}
