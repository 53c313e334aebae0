package policy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// Save then Load gives back the very same bits, in every dtype, tied or not, and Save writes what
// transformers expects: HF names, no lm_head when tied, config.json with architectures and dtype.
func TestSaveLoadRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		family string
		dt     gotch.DType
	}{{arch.Llama, gotch.Float}, {arch.Qwen2, gotch.BFloat16}, {arch.Qwen3, gotch.Half}, {arch.Qwen3, gotch.Double},
		{arch.Mistral, gotch.Float}, {arch.Gemma, gotch.BFloat16}, {arch.Qwen3MoE, gotch.BFloat16}} {
		t.Run(tc.family+"-"+DTypeName(tc.dt), func(t *testing.T) {
			m := randomModel(t, tc.family, 64, tc.dt, 0.02, 1)
			dir := t.TempDir()
			onTorch(t, func() error {
				if err := m.Save(dir); err != nil {
					return err
				}
				back, err := Load(dir, gotch.CPU, tc.dt)
				if err != nil {
					return err
				}
				a, b := m.Parameters(), back.Parameters()
				if len(a) != len(b) {
					return fmt.Errorf("%d parameters saved, %d loaded", len(a), len(b))
				}
				for i := range a {
					x, err := torch.Bytes(a[i].T)
					if err != nil {
						return err
					}
					y, err := torch.Bytes(b[i].T)
					if err != nil {
						return err
					}
					if a[i].Name != b[i].Name || !bytes.Equal(x, y) {
						return fmt.Errorf("%s: loaded tensor differs from the saved one", a[i].Name)
					}
					if !b[i].T.MustRequiresGrad() {
						return fmt.Errorf("%s does not require grad", b[i].Name)
					}
				}
				if back.Config.TieWordEmbeddings != m.Config.TieWordEmbeddings || back.LMHead == nil {
					return fmt.Errorf("tie_word_embeddings lost")
				}
				return nil
			})
			hdr := readHeaderJSON(t, filepath.Join(dir, "model.safetensors"))
			if _, ok := hdr["lm_head.weight"]; ok == m.Config.TieWordEmbeddings {
				t.Fatalf("lm_head.weight written: %v, tied: %v", ok, m.Config.TieWordEmbeddings)
			}
			if !strings.Contains(string(hdr["__metadata__"]), `"format":"pt"`) {
				t.Fatalf("metadata %s lacks format pt (transformers requires it)", hdr["__metadata__"])
			}
			var cfg map[string]any
			data, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			if err := json.Unmarshal(data, &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg["torch_dtype"] != DTypeName(tc.dt) || cfg["model_type"] != tc.family || cfg["architectures"] == nil {
				t.Fatalf("config.json: %s", data)
			}
		})
	}
}

func readHeaderJSON(t *testing.T, path string) map[string]json.RawMessage {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(data)
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	return hdr
}

// rewrite edits the safetensors header of path with fn and writes the file back (data unchanged).
func rewrite(t *testing.T, path string, fn func(hdr map[string]json.RawMessage)) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(data)
	hdr := readHeaderJSON(t, path)
	fn(hdr)
	js, _ := json.Marshal(hdr)
	var out bytes.Buffer
	binary.Write(&out, binary.LittleEndian, uint64(len(js)))
	out.Write(js)
	out.Write(data[8+n:])
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A broken folder fails with an error naming the tensor or the file.
func TestLoadErrors(t *testing.T) {
	m := randomModel(t, arch.Qwen2, 64, gotch.Float, 0.02, 1)
	src := t.TempDir()
	onTorch(t, func() error { return m.Save(src) })
	const q = "model.layers.1.self_attn.q_proj.weight"
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   []string
	}{
		{"missing tensor", func(t *testing.T, dir string) {
			rewrite(t, filepath.Join(dir, "model.safetensors"), func(h map[string]json.RawMessage) {
				h[q+"_renamed"] = h[q] // its bytes stay accounted for: the data still tile
				delete(h, q)
			})
		}, []string{"missing tensor " + q}},
		{"wrong shape", func(t *testing.T, dir string) {
			rewrite(t, filepath.Join(dir, "model.safetensors"), func(h map[string]json.RawMessage) {
				var e stEntry
				json.Unmarshal(h[q], &e)
				e.Shape = []int64{e.Shape[1], e.Shape[0] / 2, 2}
				h[q], _ = json.Marshal(e)
			})
		}, []string{q, "shape"}},
		{"unknown dtype", func(t *testing.T, dir string) {
			rewrite(t, filepath.Join(dir, "model.safetensors"), func(h map[string]json.RawMessage) {
				var e stEntry
				json.Unmarshal(h[q], &e)
				e.DType = "I32"
				h[q], _ = json.Marshal(e)
			})
		}, []string{q, "I32"}},
		{"truncated", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model.safetensors")
			info, _ := os.Stat(path)
			os.Truncate(path, info.Size()-100)
		}, []string{"model.safetensors", "truncated"}},
		{"truncated header", func(t *testing.T, dir string) {
			os.Truncate(filepath.Join(dir, "model.safetensors"), 5)
		}, []string{"model.safetensors", "truncated"}},
		{"no weights", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "model.safetensors"))
		}, []string{"no model.safetensors"}},
		{"overlapping data offsets", func(t *testing.T, dir string) {
			// Layer 1's q_proj points at layer 0's bytes (the reference loader refuses this; before,
			// the second tensor silently got the first one's data).
			rewrite(t, filepath.Join(dir, "model.safetensors"), func(h map[string]json.RawMessage) {
				h[q] = h["model.layers.0.self_attn.q_proj.weight"]
			})
		}, []string{"model.safetensors", "overlaps"}},
		{"gap in the data", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model.safetensors")
			rewrite(t, path, func(h map[string]json.RawMessage) {})
			f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			f.Write(make([]byte, 16))
			f.Close()
		}, []string{"model.safetensors", "belong to no tensor"}},
		{"layers beyond the bound", func(t *testing.T, dir string) {
			// Before: 1,000,000 layers built for 38 s and 4 GB before "missing tensor".
			data, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			data = regexp.MustCompile(`"num_hidden_layers": \d+`).ReplaceAll(data, []byte(`"num_hidden_layers": 1000000`))
			os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
		}, []string{"config.json", "num_hidden_layers 1000000 exceeds the bound 1024"}},
		{"bad config", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"qwen2","hidden_size":-1}`), 0o644)
		}, []string{"config.json", "hidden_size"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range []string{"config.json", "model.safetensors"} {
				data, _ := os.ReadFile(filepath.Join(src, f))
				os.WriteFile(filepath.Join(dir, f), data, 0o644)
			}
			tc.break_(t, dir)
			onTorch(t, func() error {
				_, err := Load(dir, gotch.CPU, gotch.Float)
				if err == nil {
					return fmt.Errorf("loaded a folder with a %s", tc.name)
				}
				t.Log(err)
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						return fmt.Errorf("error %q does not mention %q", err, w)
					}
				}
				return nil
			})
		})
	}
}

// A sharded checkpoint (model.safetensors.index.json) loads like a single file.
func TestLoadSharded(t *testing.T) {
	m := randomModel(t, arch.Llama, 64, gotch.Float, 0.02, 1)
	dir := t.TempDir()
	onTorch(t, func() error {
		if err := WriteConfig(dir, m.Config); err != nil {
			return err
		}
		var first, second []stTensor
		index := map[string]string{}
		for i, s := range m.slots() {
			tt := *s.ptr
			st := stTensor{Name: s.name, DType: gotch.Float, Shape: s.shape, Data: func() ([]byte, error) { return torch.Bytes(tt) }}
			shard := "model-00001-of-00002.safetensors"
			if i%2 == 1 {
				shard = "model-00002-of-00002.safetensors"
				second = append(second, st)
			} else {
				first = append(first, st)
			}
			index[s.name] = shard
		}
		if err := writeSafetensors(filepath.Join(dir, "model-00001-of-00002.safetensors"), first, nil); err != nil {
			return err
		}
		if err := writeSafetensors(filepath.Join(dir, "model-00002-of-00002.safetensors"), second, nil); err != nil {
			return err
		}
		js, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": index})
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), js, 0o644); err != nil {
			return err
		}
		back, err := Load(dir, gotch.CPU, gotch.Float)
		if err != nil {
			return err
		}
		ids := idsTensor([]int{1, 2, 3, 4})
		a, b := values(m.Forward(ids, nil, nil, nil)), values(back.Forward(ids, nil, nil, nil))
		for i := range a {
			if a[i] != b[i] {
				return fmt.Errorf("sharded checkpoint gives different logits")
			}
		}
		return nil
	})
}

// SaveSharded writes transformers' shards and index when the model does not fit one shard; Load reads
// them back bit-exact; saving again in the other layout leaves no file of the first one to confuse a
// loader.
func TestSaveShardedRoundTrip(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 64, gotch.Float, 0.02, 4)
	dir := t.TempDir()
	var total int64
	for _, s := range m.slots() {
		n := int64(4)
		for _, d := range s.shape {
			n *= d
		}
		total += n
	}
	maxShard := total / 3
	onTorch(t, func() error {
		if err := m.SaveSharded(dir, maxShard); err != nil {
			return err
		}
		return sameWeights(m, dir)
	})
	var index struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &index); err != nil {
		t.Fatal(err)
	}
	if index.Metadata["total_size"] != total || len(index.WeightMap) != len(m.slots()) {
		t.Errorf("index: total_size %d (want %d), %d tensors (want %d)", index.Metadata["total_size"], total, len(index.WeightMap), len(m.slots()))
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
	if len(shards) < 3 {
		t.Fatalf("%d shards for max %d of %d bytes, want at least 3", len(shards), maxShard, total)
	}
	for i, s := range shards {
		if filepath.Base(s) != shardName(i, len(shards)) {
			t.Errorf("shard %d is %s, want %s", i, filepath.Base(s), shardName(i, len(shards)))
		}
		var size int64
		for name, raw := range readHeaderJSON(t, s) {
			var e stEntry
			if name != "__metadata__" && json.Unmarshal(raw, &e) == nil {
				size += e.Offsets[1] - e.Offsets[0]
			}
		}
		if size > maxShard && len(readHeaderJSON(t, s)) > 2 {
			t.Errorf("%s holds %d data bytes, more than the %d allowed, in more than one tensor", s, size, maxShard)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); !os.IsNotExist(err) {
		t.Errorf("a sharded save left model.safetensors (%v)", err)
	}
	// The other layout replaces the first one.
	onTorch(t, func() error {
		if err := m.Save(dir); err != nil {
			return err
		}
		return sameWeights(m, dir)
	})
	if left, _ := filepath.Glob(filepath.Join(dir, "model*")); len(left) != 1 || filepath.Base(left[0]) != "model.safetensors" {
		t.Errorf("after a single-file save: %v, want only model.safetensors", left)
	}
	onTorch(t, func() error { return m.SaveSharded(dir, maxShard) })
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); !os.IsNotExist(err) {
		t.Errorf("a sharded save over a single-file one left model.safetensors (%v)", err)
	}
}

// sameWeights loads dir and checks every parameter equals m's, byte for byte.
func sameWeights(m *Model, dir string) error {
	back, err := Load(dir, gotch.CPU, m.dtype)
	if err != nil {
		return err
	}
	a, b := m.Parameters(), back.Parameters()
	if len(a) != len(b) {
		return fmt.Errorf("%d parameters saved, %d loaded", len(a), len(b))
	}
	for i := range a {
		x, err := torch.Bytes(a[i].T)
		if err != nil {
			return err
		}
		y, err := torch.Bytes(b[i].T)
		if err != nil {
			return err
		}
		if a[i].Name != b[i].Name || !bytes.Equal(x, y) {
			return fmt.Errorf("%s: loaded tensor differs from the saved one", a[i].Name)
		}
	}
	return nil
}

// Reload takes the config.json of the folder it reads, not only its weights (before: a reload from
// a folder with another rope_theta, rms_norm_eps and max_position_embeddings but the same shapes
// kept computing with the old ones), and refuses another architecture naming the key.
func TestReloadTakesNewConfig(t *testing.T) {
	m := randomModel(t, arch.Qwen3, 64, gotch.Float, 0.5, 1)
	a, b := t.TempDir(), t.TempDir()
	other := randomModel(t, arch.Qwen3, 64, gotch.Float, 0.5, 2)
	other.Config.RopeTheta, other.Config.RMSNormEps, other.Config.MaxPositionEmbeddings = 50, 0.5, 99
	onTorch(t, func() error {
		if err := m.Save(a); err != nil {
			return err
		}
		return other.Save(b)
	})
	ids := []int{1, 5, 9, 13, 2, 60, 7, 7, 30, 41, 3, 8}
	logits := func(x *Model) []float64 {
		var out []float64
		onTorch(t, func() error {
			out = values(x.Forward(idsTensor(ids), nil, nil, nil))
			return nil
		})
		return out
	}
	var served, fresh *Model
	onTorch(t, func() error {
		var err error
		if served, err = Load(a, gotch.CPU, gotch.Float); err != nil {
			return err
		}
		fresh, err = Load(b, gotch.CPU, gotch.Float)
		return err
	})
	want := logits(fresh)
	logits(served) // grows the old rotary tables
	onTorch(t, func() error { return served.Reload(fresh) })
	if c := served.Config; c.RopeTheta != 50 || c.RMSNormEps != 0.5 || c.MaxPositionEmbeddings != 99 {
		t.Errorf("after reload: rope_theta %g, rms_norm_eps %g, max_position_embeddings %d; want 50, 0.5, 99",
			c.RopeTheta, c.RMSNormEps, c.MaxPositionEmbeddings)
	}
	got := logits(served)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d after reload: %g, the folder's model gives %g", i, got[i], want[i])
		}
	}
	wide := randomModel(t, arch.Qwen3, 64, gotch.Float, 0.5, 3)
	wide.Config.HiddenAct = "gelu"
	wide.opts = newOptions(wide.Config)
	onTorch(t, func() error {
		if err := served.Reload(wide); err == nil || !strings.Contains(err.Error(), "hidden_act") {
			t.Errorf("another activation: err %v", err)
		}
		return nil
	})
}
