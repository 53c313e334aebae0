package policy

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"
	lib "github.com/sugarme/gotch/libtch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// Param is one trainable tensor with its checkpoint name.
type Param struct {
	Name string
	T    *ts.Tensor
}

// init says how NewRandom fills a weight (transformers' _init_weights).
type initKind int

const (
	initNormal initKind = iota // N(0, initializer_range²): linear and embedding weights
	initZeros                  // biases
	initOnes                   // norm weights
)

// slot is one weight of the model: its checkpoint name, shape, initialisation and where it lives.
type slot struct {
	name  string
	shape []int64
	init  initKind
	ptr   **ts.Tensor
}

// skeleton builds a model with no tensors yet: the structure its config implies.
func skeleton(cfg Config, dev gotch.Device, dt gotch.DType) *Model {
	m := &Model{Config: cfg, dtype: dt, device: dev, compute: gotch.Float}
	if dt == gotch.Double {
		m.compute = gotch.Double
	}
	m.Layers = make([]*Layer, cfg.NumHiddenLayers)
	for i := range m.Layers {
		l := &Layer{}
		if cfg.ModelType == Qwen3 {
			l.SelfAttn.QNorm, l.SelfAttn.KNorm = &RMSNorm{}, &RMSNorm{}
		}
		m.Layers[i] = l
	}
	return m
}

// slots lists every weight of m, in checkpoint order; a tied lm_head is not listed.
func (m *Model) slots() []slot {
	c := m.Config
	h, inter := int64(c.HiddenSize), int64(c.IntermediateSize)
	q, kv, d := int64(c.NumAttentionHeads*c.HeadDim), int64(c.NumKeyValueHeads*c.HeadDim), int64(c.HeadDim)
	out := []slot{{"model.embed_tokens.weight", []int64{int64(c.VocabSize), h}, initNormal, &m.EmbedTokens}}
	linear := func(prefix string, l *Linear, in, outDim int64, bias bool) {
		out = append(out, slot{prefix + ".weight", []int64{outDim, in}, initNormal, &l.Weight})
		if bias {
			out = append(out, slot{prefix + ".bias", []int64{outDim}, initZeros, &l.Bias})
		}
	}
	norm := func(name string, n *RMSNorm, dim int64) {
		out = append(out, slot{name + ".weight", []int64{dim}, initOnes, &n.Weight})
	}
	for i, l := range m.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		norm(p+"input_layernorm", &l.InputLayernorm, h)
		a := &l.SelfAttn
		linear(p+"self_attn.q_proj", &a.QProj, h, q, c.qkvBias())
		linear(p+"self_attn.k_proj", &a.KProj, h, kv, c.qkvBias())
		linear(p+"self_attn.v_proj", &a.VProj, h, kv, c.qkvBias())
		linear(p+"self_attn.o_proj", &a.OProj, q, h, c.oBias())
		if a.QNorm != nil {
			norm(p+"self_attn.q_norm", a.QNorm, d)
			norm(p+"self_attn.k_norm", a.KNorm, d)
		}
		norm(p+"post_attention_layernorm", &l.PostAttentionLayernorm, h)
		linear(p+"mlp.gate_proj", &l.MLP.GateProj, h, inter, c.mlpBias())
		linear(p+"mlp.up_proj", &l.MLP.UpProj, h, inter, c.mlpBias())
		linear(p+"mlp.down_proj", &l.MLP.DownProj, inter, h, c.mlpBias())
	}
	norm("model.norm", &m.Norm, h)
	if !c.TieWordEmbeddings {
		out = append(out, slot{"lm_head.weight", []int64{int64(c.VocabSize), h}, initNormal, &m.LMHead})
	}
	return out
}

// norms lists the model's RMSNorms, to give them their ε.
func (m *Model) norms() []*RMSNorm {
	var out []*RMSNorm
	for _, l := range m.Layers {
		out = append(out, &l.InputLayernorm, &l.PostAttentionLayernorm)
		if l.SelfAttn.QNorm != nil {
			out = append(out, l.SelfAttn.QNorm, l.SelfAttn.KNorm)
		}
	}
	return append(out, &m.Norm)
}

// finish creates the model's constants once its weights are in place.
func (m *Model) finish() {
	if m.Config.TieWordEmbeddings {
		m.LMHead = m.EmbedTokens
	}
	m.rope = newRope(m.Config, m.dtype)
	_ = torch.Untracked(func() error {
		// 0-dim tensors (gotch cannot create them directly): they never promote a tensor's dtype.
		eps := ts.MustFull([]int64{1}, ts.FloatScalar(m.Config.RMSNormEps), m.compute, m.device).MustSqueeze(true)
		for _, n := range m.norms() {
			n.eps = eps
		}
		m.scale = ts.MustFull([]int64{1}, ts.FloatScalar(1/math.Sqrt(float64(m.Config.HeadDim))), m.compute, m.device).MustSqueeze(true)
		return nil
	})
}

// checkDType rejects dtypes a model cannot be built in.
func checkDType(dt gotch.DType) error {
	switch dt {
	case gotch.Float, gotch.BFloat16, gotch.Half, gotch.Double:
		return nil
	}
	return fmt.Errorf("model dtype %v: want float32, bfloat16, float16 or float64", dt)
}

// build fills every slot with fill's tensor (created on the CPU in any float dtype), converted to
// the model's dtype and device and marked as requiring grad. The weights are owned by the model,
// not by any open torch scope.
func (m *Model) build(fill func(s slot) (*ts.Tensor, error)) error {
	err := torch.Untracked(func() error {
		for _, s := range m.slots() {
			err := func() error {
				sc := torch.NewScope()
				defer sc.Close()
				t, err := fill(s)
				if err != nil {
					return err
				}
				if t.DType() != m.dtype {
					t = t.MustTotype(m.dtype, false)
				}
				if m.device != gotch.CPU {
					t = t.MustTo(m.device, false)
				}
				t = t.MustSetRequiresGrad(true, false)
				sc.Keep(t)
				*s.ptr = t
				return nil
			}()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		m.free()
		return err
	}
	m.finish()
	return nil
}

// free releases whatever weights m holds.
func (m *Model) free() {
	for _, s := range m.slots() {
		if *s.ptr != nil {
			(*s.ptr).MustDrop()
		}
	}
}

// NewRandom creates a model with transformers' initialisation: linear and embedding weights drawn
// from N(0, initializer_range²), biases zero, norm weights one. The draws are made on the CPU in
// float32 from a generator seeded with seed, so a seed gives the same weights on every device.
// (This reseeds libtorch's global generator.) Keys left zero in cfg take the defaults ReadConfig
// gives them (num_key_value_heads, head_dim, rms_norm_eps, rope_theta, initializer_range …).
// Call it on the torch thread.
func NewRandom(cfg Config, dev gotch.Device, dtype gotch.DType, seed int64) (*Model, error) {
	cfg.fillDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkDType(dtype); err != nil {
		return nil, err
	}
	cfg.TorchDType = DTypeName(dtype)
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
	cfg, err := ReadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
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
// creating it if needed, so that transformers and vLLM load the folder as it is. A tied lm_head is
// not written (transformers ties it again on load). Call it on the torch thread.
func (m *Model) Save(dir string) error {
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
	for _, s := range m.slots() {
		t := *s.ptr
		tensors = append(tensors, stTensor{Name: s.name, DType: m.dtype, Shape: s.shape, Data: func() ([]byte, error) {
			return tensorBytes(t)
		}})
	}
	path := filepath.Join(dir, "model.safetensors")
	if err := writeSafetensors(path, tensors, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "config.json"), js); err != nil {
		return fmt.Errorf("save model: %w", err)
	}
	return nil
}

// tensorBytes copies a tensor's data to the host as raw little-endian bytes.
func tensorBytes(t *ts.Tensor) ([]byte, error) {
	n := t.Numel() * t.DType().Size()
	buf := make([]byte, n)
	if n == 0 {
		return buf, nil
	}
	var err error
	_ = torch.NoGrad(func() error {
		s := torch.NewScope()
		defer s.Close()
		c := t.MustDetach(false).MustTo(gotch.CPU, true).MustContiguous(true)
		lib.AtCopyData(lib.Ctensor(c.Ctensor()), unsafe.Pointer(&buf[0]), t.Numel(), t.DType().Size())
		err = ts.TorchErr()
		return nil
	})
	return buf, err
}

// writeFileAtomic writes data to path through a temporary file in the same folder.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp makes 0600 files
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Parameters returns the model's trainable tensors sorted by name (a tied lm_head appears once, as
// model.embed_tokens.weight). They require grad; update them in place under torch.NoGrad.
func (m *Model) Parameters() []Param {
	var out []Param
	for _, s := range m.slots() {
		out = append(out, Param{Name: s.name, T: *s.ptr})
	}
	slices.SortFunc(out, func(a, b Param) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// NumParams counts the elements of Parameters.
func (m *Model) NumParams() int64 { return m.Config.NumParams() }

// WriteConfig writes cfg as dir/config.json.
func WriteConfig(dir string, cfg Config) error {
	js, err := cfg.MarshalJSON()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "config.json"), js)
}
