package train

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/drmas/drmas/pkg/rundir"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// rundir.Files reads the tensors of a checkpoint (weights and optimizer state, every model).
func ckptTensorFiles(t *testing.T, dir string, step int) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(rundir.CheckpointDir(dir, step), "*", "*.safetensors"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("checkpoint step-%d of %s: no tensor files (%v)", step, dir, err)
	}
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(filepath.Join(filepath.Base(filepath.Dir(rel)), filepath.Base(rel)))] = b
	}
	return out
}

func sameCheckpoint(t *testing.T, a, b string, step int) {
	t.Helper()
	fa, fb := ckptTensorFiles(t, a, step), ckptTensorFiles(t, b, step)
	if len(fa) != len(fb) {
		t.Fatalf("step-%d: %d tensor files vs %d", step, len(fa), len(fb))
	}
	for name, x := range fa {
		if !bytes.Equal(x, fb[name]) {
			t.Errorf("step-%d %s differs", step, name)
		}
	}
}

// TestOffloadBitEqual: with models[].optim.offload: cpu the optimizer state lives in host tensors of
// its own (here host == device, so every copy is host to host) and the arithmetic is the same, so a
// toy-math run — warm-up included, whose weights the offloaded master copies must take up — logs
// the same metrics and saves the same weights and optimizer state, bit for bit, as one without.
func TestOffloadBitEqual(t *testing.T) {
	twoModels := []string{`models=[{id: a, tokenizer: configs/toy/tokenizer.json, optim: {lr: 1.0e-3}, init: {hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2}},
		{id: b, tokenizer: configs/toy/tokenizer.json, optim: {lr: 1.0e-3}, init: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}}]`,
		"agents.0.model=a", "agents.1.model=b"}
	for _, c := range []struct {
		name, model string
		sets        []string
	}{
		{"shared float32", "small", nil},
		{"shared bfloat16", "small", []string{"models.0.dtype=bfloat16"}},
		{"two models, one offloaded", "a", twoModels},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := t.TempDir(), t.TempDir()
			// An entropy bonus gives every step a gradient whatever the sampled rewards (on libtorch 2.6
			// the bfloat16 team's rewards, and so its advantages, were all 0 at step 4).
			sets := append([]string{"run.steps=4", "algorithm.entropy_coef=0.01"}, c.sets...)
			train(t, tinyConfig(t, a, sets...), Options{})
			train(t, tinyConfig(t, b, append(sets, "models.0.optim.offload=cpu")...), Options{})
			ra := readRows(t, a)
			if len(ra) != 4 {
				t.Fatalf("%d metrics rows, want 4", len(ra))
			}
			if g, _ := ra[3]["grad_norm/model/"+c.model].(float64); g == 0 {
				t.Fatal("no gradient norm: the comparison would prove nothing")
			}
			sameRows(t, ra, readRows(t, b))
			sameCheckpoint(t, a, b, 4)
		})
	}
}

// TestOffloadStateOnHost: an offloaded model's AdamW state is CPU tensors, with a host master copy of
// every parameter (float32 ones too) that is storage of its own; a model without offload keeps no
// master copy of float32 weights.
func TestOffloadStateOnHost(t *testing.T) {
	for _, offload := range []string{"none", "cpu"} {
		tr, err := New(context.Background(), tinyConfig(t, t.TempDir(), "models.0.optim.offload="+offload), Options{})
		if err != nil {
			t.Fatal(err)
		}
		ms := modelOf(tr, "small")
		o := ms.opt
		if o.Offload != (offload == "cpu") || o.Device().Name != "CPU" {
			t.Errorf("offload %s: Offload %v, state on %v", offload, o.Offload, o.Device())
		}
		for i := range o.Params {
			for _, s := range []struct {
				name string
				dev  gotch.Device
				ok   bool
			}{{"m", deviceOf(o.M[i]), true}, {"v", deviceOf(o.V[i]), true}, {"master", deviceOf(o.Master[i]), o.Master[i] != nil}} {
				if offload == "cpu" && (!s.ok || s.dev.Name != "CPU") {
					t.Errorf("offload cpu: %s %s: present %v on %v, want a CPU tensor", o.Names[i], s.name, s.ok, s.dev)
				}
			}
			if offload == "none" && o.Master[i] != nil {
				t.Errorf("offload none: float32 %s has a master copy", o.Names[i])
			}
			if offload == "cpu" && dataPtr(o.Master[i]) == dataPtr(o.Params[i]) {
				t.Errorf("offload cpu: %s's master copy shares the parameter's storage", o.Names[i])
			}
		}
		tr.Close()
	}
}

// TestOffloadResumeSwitched: a checkpoint resumes with offload switched on or off (the saved format
// does not depend on it) and ends equal, bit for bit, to the uninterrupted run.
func TestOffloadResumeSwitched(t *testing.T) {
	whole := t.TempDir()
	train(t, tinyConfig(t, whole), Options{})
	for _, sw := range [][2]string{{"none", "cpu"}, {"cpu", "none"}} {
		parts := t.TempDir()
		train(t, tinyConfig(t, parts, "run.steps=2", "models.0.optim.offload="+sw[0]), Options{})
		tr := train(t, tinyConfig(t, parts, "models.0.optim.offload="+sw[1]), Options{Resume: true})
		if tr.step != 4 {
			t.Fatalf("%s → %s: resumed run ended at step %d, want 4", sw[0], sw[1], tr.step)
		}
		sameRows(t, readRows(t, whole), readRows(t, parts))
		sameCheckpoint(t, whole, parts, 4)
	}
}

func deviceOf(t *ts.Tensor) gotch.Device {
	if t == nil {
		return gotch.Device{Name: "none"}
	}
	return t.MustDevice()
}

func dataPtr(t *ts.Tensor) unsafe.Pointer {
	p, err := t.DataPtr()
	if err != nil {
		panic(err)
	}
	return p
}
