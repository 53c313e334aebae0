package policy

// Models made and kept: random initialisation, Hugging Face folders read and written (the weights
// themselves are weights.go's; the safetensors files, safetensors.go's and tensorfile.go's).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/torch"
)

// memInfoPath is where the machine's memory is read (a variable for the tests).
var memInfoPath = "/proc/meminfo"

// CheckMemory refuses a model whose weights alone (parameters × dtype bytes) exceed the memory of
// the machine (MemTotal in /proc/meminfo) when they are to live on the CPU, before any tensor is
// made: such a model can never be built, and libtorch would take minutes and the machine's swap to
// find out. GPU memory is not known here; libtorch refuses an oversized CUDA allocation cleanly.
// Where the memory cannot be read, nothing is refused.
func CheckMemory(cfg arch.Config, dev gotch.Device, dt gotch.DType) error {
	if dev != gotch.CPU {
		return nil
	}
	total, ok := memTotal()
	if !ok {
		return nil
	}
	params := cfg.NumParams()
	need := float64(params) * float64(dt.Size())
	if need > float64(total) {
		return fmt.Errorf("the model's %d parameters need %.1f GiB in %s, more than this machine's %.1f GiB of memory (%s MemTotal)",
			params, need/(1<<30), DTypeName(dt), float64(total)/(1<<30), memInfoPath)
	}
	return nil
}

// memTotal reads MemTotal from memInfoPath, in bytes.
func memTotal() (int64, bool) {
	data, err := os.ReadFile(memInfoPath)
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil || kb <= 0 {
				return 0, false
			}
			return kb << 10, true
		}
	}
	return 0, false
}

// checkDType rejects dtypes a model cannot be built in.
func checkDType(dt gotch.DType) error {
	switch dt {
	case gotch.Float, gotch.BFloat16, gotch.Half, gotch.Double:
		return nil
	}
	return fmt.Errorf("model dtype %v: want float32, bfloat16, float16 or float64", dt)
}

// placeWeight is t as a weight is stored: in dtype, on dev, requiring grad (a new tensor of the open
// scope where a conversion or move is needed).
func placeWeight(t *ts.Tensor, dtype gotch.DType, dev gotch.Device) *ts.Tensor {
	if t.DType() != dtype {
		t = t.MustTotype(dtype, false)
	}
	if dev != gotch.CPU {
		t = t.MustTo(dev, false)
	}
	return t.MustSetRequiresGrad(true, false)
}

// placeEach creates weights 0…n−1 one at a time, each in its own scope: create(i) (on the CPU, any
// float dtype) placed by placeWeight, then handed to set(i), owned by no open scope.
func placeEach(n int, dtype gotch.DType, dev gotch.Device, create func(i int) (*ts.Tensor, error), set func(i int, t *ts.Tensor)) error {
	return torch.Untracked(func() error {
		for i := range n {
			err := func() error {
				sc := torch.NewScope()
				defer sc.Close()
				t, err := create(i)
				if err != nil {
					return err
				}
				t = placeWeight(t, dtype, dev)
				sc.Keep(t)
				set(i, t)
				return nil
			}()
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// NewRandom creates a model with transformers' initialisation: linear and embedding weights drawn
// from N(0, initializer_range²), biases zero, norm weights one. The draws are made on the CPU in
// float32 from a generator seeded with seed, so a seed gives the same weights on every device.
// (This reseeds libtorch's global generator.) Keys left zero in cfg take the defaults arch.ReadConfig
// gives them (num_key_value_heads, head_dim, rms_norm_eps, rope_theta, initializer_range …).
// Call it on the torch thread.
func NewRandom(cfg arch.Config, dev gotch.Device, dtype gotch.DType, seed int64) (*Model, error) {
	cfg.FillDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkDType(dtype); err != nil {
		return nil, err
	}
	cfg.TorchDType = DTypeName(dtype)
	if err := CheckMemory(cfg, dev, dtype); err != nil {
		return nil, err
	}
	m := skeleton(cfg, dev, dtype)
	torch.ManualSeed(seed)
	calc := gotch.Float
	if dtype == gotch.Double {
		calc = gotch.Double
	}
	err := m.build(func(s slot) (*ts.Tensor, error) {
		switch s.init {
		case initZeros:
			return ts.MustZeros(s.shape, calc, gotch.CPU), nil
		case initOnes:
			return ts.MustOnes(s.shape, calc, gotch.CPU), nil
		}
		t := ts.MustZeros(s.shape, calc, gotch.CPU)
		t.MustNormal_(0, cfg.InitializerRange)
		if s.name == "model.embed_tokens.weight" && cfg.PadTokenID != nil && *cfg.PadTokenID >= 0 && *cfg.PadTokenID < cfg.VocabSize {
			row := t.MustNarrow(0, int64(*cfg.PadTokenID), 1, false)
			row.MustFill_(ts.FloatScalar(0))
		}
		return t, nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Load reads a Hugging Face model folder: config.json and model.safetensors (or the shards of
// model.safetensors.index.json), with F32, BF16, F16 or F64 tensors, converted to dtype on dev.
// Tensors the model does not use (a tied lm_head, rotary buffers) are ignored. Errors name the file
// and the tensor. Call it on the torch thread.
func Load(dir string, dev gotch.Device, dtype gotch.DType) (*Model, error) {
	if err := checkDType(dtype); err != nil {
		return nil, err
	}
	cfg, err := arch.ReadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	if err := CheckMemory(cfg, dev, dtype); err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	ck, err := openCheckpoint(dir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	defer ck.Close()
	m := skeleton(cfg, dev, dtype)
	used := map[string]bool{}
	err = m.build(func(s slot) (*ts.Tensor, error) {
		data, dt, err := ck.read(s.name, s.shape)
		if err != nil {
			return nil, err
		}
		used[s.name] = true
		return ts.OfDataSize(data, s.shape, dt)
	})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	var unused []string
	for name := range ck.byName {
		if !used[name] {
			unused = append(unused, name)
		}
	}
	if len(unused) > 0 {
		slices.Sort(unused)
		log.Debug().Str("model", dir).Strs("tensors", unused).Msg("checkpoint tensors not used by the model")
	}
	return m, nil
}

// Save writes config.json and model.safetensors (Hugging Face names, the model's dtype) to dir,
// creating it if needed, so that transformers and vLLM load the folder as it is. A model larger than
// DefaultMaxShardBytes (5 GB) is written as shards (see SaveSharded). A tied lm_head is
// not written (transformers ties it again on load). Call it on the torch thread.
func (m *Model) Save(dir string) error { return m.SaveSharded(dir, 0) }

// SaveSharded is Save with shards of at most maxShardBytes of data (0: DefaultMaxShardBytes) and
// model.safetensors.index.json, as save_pretrained writes them, when the model does not fit in one.
// Tensors are copied out one at a time, so saving needs the model's memory plus its largest tensor,
// not twice the model; a model whose weights are sharded (units.go) is saved in a forward pass that
// gathers one layer at a time as its tensors' turn comes. Call it on the torch thread.
func (m *Model) SaveSharded(dir string, maxShardBytes int64) error {
	if a := m.Adapter(); a != nil {
		return a.Save(dir)
	}
	if m.lora != nil {
		return errors.New("save model: a view with several adapters: save each adapter")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save model: %w", err)
	}
	cfg := m.Config
	cfg.TorchDType = DTypeName(m.dtype)
	js, err := cfg.MarshalJSON()
	if err != nil {
		return err
	}
	var tensors []stTensor
	stream := m.unitStream()
	defer stream.end()
	for _, s := range m.slots() {
		t, name := *s.ptr, s.name
		tensors = append(tensors, stTensor{Name: s.name, DType: m.dtype, Shape: s.shape, Data: func() ([]byte, error) {
			stream.reach(name)
			return torch.Bytes(t)
		}})
	}
	if err := writeCheckpoint(dir, tensors, maxShardBytes, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	if err := atomicfile.WriteBytes(filepath.Join(dir, "config.json"), js); err != nil {
		return fmt.Errorf("save model: %w", err)
	}
	return nil
}

// WriteConfig writes cfg as dir/config.json.
func WriteConfig(dir string, cfg arch.Config) error {
	js, err := cfg.MarshalJSON()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return atomicfile.WriteBytes(filepath.Join(dir, "config.json"), js)
}
