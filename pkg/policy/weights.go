package policy

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"unsafe"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"
	lib "github.com/sugarme/gotch/libtch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/torch"
)

// Param is one trainable tensor with its checkpoint name.
type Param struct {
	Name string
	T    *ts.Tensor
}

// SplitParams is ps as the parallel name and tensor lists optimizers and collectives take.
func SplitParams(ps []Param) (names []string, tensors []*ts.Tensor) {
	for _, p := range ps {
		names, tensors = append(names, p.Name), append(tensors, p.T)
	}
	return names, tensors
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

// weightLister is a component that lists its own weights (Linear, RMSNorm, a family's norm …):
// their slots, named prefix + the checkpoint's suffix ("weight", "bias").
type weightLister interface {
	weights(prefix string, out *[]slot)
}

// collect appends the slots of x (a pointer to a component or to a struct of them) under prefix. A
// weightLister lists its own; any other struct contributes its fields tagged `hf:"name"`, under
// prefix + name + ".", skipping nil pointers and interfaces (weights the configuration does not have).
func collect(prefix string, x any, out *[]slot) {
	if w, ok := x.(weightLister); ok {
		w.weights(prefix, out)
		return
	}
	v := reflect.ValueOf(x).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name, ok := t.Field(i).Tag.Lookup("hf")
		if !ok {
			continue
		}
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Pointer, reflect.Interface:
			if !f.IsNil() {
				collect(prefix+name+".", f.Interface(), out)
			}
		case reflect.Struct:
			collect(prefix+name+".", f.Addr().Interface(), out)
		default:
			panic(fmt.Sprintf("policy: %s.%s: an hf-tagged field must be a component, a struct or a pointer", t, t.Field(i).Name))
		}
	}
}

// skeleton builds a model with no tensors yet: the structure its config implies, from its family's
// options (arch.OptionsOf). cfg must be valid.
func skeleton(cfg arch.Config, dev gotch.Device, dt gotch.DType) *Model {
	m := &Model{Config: cfg, opts: newOptions(cfg), dtype: dt, device: dev, compute: gotch.Float}
	if dt == gotch.Double {
		m.compute = gotch.Double
	}
	m.Layers = make([]layer, cfg.NumHiddenLayers)
	for i := range m.Layers {
		m.Layers[i] = newDecoderLayer(m.opts)
	}
	m.Norm = newNorm(m.opts)
	return m
}

// slots lists every weight of m, in checkpoint order; a tied lm_head is not listed.
func (m *Model) slots() []slot {
	o := m.opts
	out := []slot{{"model.embed_tokens.weight", []int64{o.Vocab, o.Hidden}, initNormal, &m.EmbedTokens}}
	for i, l := range m.Layers {
		collect(fmt.Sprintf("model.layers.%d.", i), l, &out)
	}
	collect("model.norm.", m.Norm, &out)
	if !m.Config.TieWordEmbeddings {
		out = append(out, slot{"lm_head.weight", []int64{o.Vocab, o.Hidden}, initNormal, &m.LMHead})
	}
	return out
}

// finish creates the model's constants once its weights are in place.
func (m *Model) finish() {
	if m.Config.TieWordEmbeddings {
		m.LMHead = m.EmbedTokens
	}
	m.head = Linear{Weight: m.LMHead, in: m.opts.Hidden, out: m.opts.Vocab}
	m.rope = newRope(m.Config, m.dtype)
	_ = torch.Untracked(func() error {
		// 0-dim tensors (gotch cannot create them directly): they never promote a tensor's dtype.
		scalar := func(v float64, dt gotch.DType) *ts.Tensor {
			return ts.MustFull([]int64{1}, ts.FloatScalar(v), dt, m.device).MustSqueeze(true)
		}
		m.eps = scalar(m.Config.RMSNormEps, m.compute)
		m.scale = scalar(1/math.Sqrt(float64(m.Config.HeadDim)), m.compute)
		if m.opts.EmbedScale != 0 {
			m.embMul = scalar(m.opts.EmbedScale, m.dtype)
		}
		return nil
	})
}

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
				t = placeWeight(t, m.dtype, m.device)
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
		m.Free()
		return err
	}
	m.finish()
	return nil
}

// Free releases whatever weights m holds, now (an adapted view owns none). Torch thread.
func (m *Model) Free() {
	if m.lora != nil { // a view owns no weights
		return
	}
	for _, s := range m.slots() {
		if *s.ptr != nil {
			(*s.ptr).MustDrop()
		}
	}
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
// not twice the model. Call it on the torch thread.
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
	for _, s := range m.slots() {
		t := *s.ptr
		tensors = append(tensors, stTensor{Name: s.name, DType: m.dtype, Shape: s.shape, Data: func() ([]byte, error) {
			return TensorBytes(t)
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

// tensorBytes copies a tensor's data to the host as raw little-endian bytes.
func TensorBytes(t *ts.Tensor) ([]byte, error) {
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

// Parameters returns the model's trainable tensors sorted by name (a tied lm_head appears once, as
// model.embed_tokens.weight). They require grad; update them in place under torch.NoGrad.
//
// An adapted view's parameters are its adapters' (their A and B matrices, PEFT names; with several
// adapters, each name is prefixed with the adapter's name and "/"): the base's are not trained.
func (m *Model) Parameters() []Param {
	if m.lora != nil {
		return m.lora.parameters()
	}
	var out []Param
	for _, s := range m.slots() {
		out = append(out, Param{Name: s.name, T: *s.ptr})
	}
	slices.SortFunc(out, func(a, b Param) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// NumParams counts the elements of Parameters.
func (m *Model) NumParams() int64 {
	if m.lora != nil {
		var n int64
		for _, a := range m.lora.adapters {
			n += a.NumParams()
		}
		return n
	}
	return m.Config.NumParams()
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

// Reload copies the weights of src, a model read from another folder (a newer checkpoint of the
// same architecture), into m in place, and takes src's configuration with them: rope_theta,
// rope_scaling, rms_norm_eps and max_position_embeddings may differ and are what m computes with
// afterwards. A src of another architecture (model type, sizes, biases, activation, tying, sliding
// window, special token ids) is refused with an error naming the key, and m is left as it was.
// Torch thread.
//
// On an adapted view (WithAdapter), src must be a view of one adapter too: its adapter's weights
// are copied into m's.
func (m *Model) Reload(src *Model) error {
	if m.lora != nil || src.lora != nil {
		a, b := m.Adapter(), src.Adapter()
		if a == nil || b == nil {
			return errors.New("reload: an adapted model reloads from an adapted model of one adapter, and a plain model from a plain one")
		}
		return a.CopyFrom(b)
	}
	a, b := m.Config, src.Config
	for _, d := range []struct {
		key      string
		old, new any
	}{
		{"model_type", a.ModelType, b.ModelType}, {"hidden_size", a.HiddenSize, b.HiddenSize},
		{"intermediate_size", a.IntermediateSize, b.IntermediateSize}, {"num_hidden_layers", a.NumHiddenLayers, b.NumHiddenLayers},
		{"num_attention_heads", a.NumAttentionHeads, b.NumAttentionHeads}, {"num_key_value_heads", a.NumKeyValueHeads, b.NumKeyValueHeads},
		{"head_dim", a.HeadDim, b.HeadDim}, {"vocab_size", a.VocabSize, b.VocabSize},
		{"tie_word_embeddings", a.TieWordEmbeddings, b.TieWordEmbeddings}, {"attention_bias", a.AttentionBias, b.AttentionBias},
		{"mlp_bias", a.MLPBias, b.MLPBias}, {"hidden_act", a.HiddenAct, b.HiddenAct},
		{"eos_token_id", fmt.Sprint(a.EOSTokenIDs), fmt.Sprint(b.EOSTokenIDs)},
		{"pad_token_id", fmtID(a.PadTokenID), fmtID(b.PadTokenID)}, {"bos_token_id", fmtID(a.BOSTokenID), fmtID(b.BOSTokenID)},
		{"options (sliding window, norms, embedding scale)", optionsKey(m.opts), optionsKey(src.opts)},
	} {
		if d.old != d.new {
			return fmt.Errorf("config.json has %s %v, the loaded model's is %v: not the same architecture (load it as a new model)", d.key, d.new, d.old)
		}
	}
	newParams := map[string]*ts.Tensor{}
	for _, p := range src.Parameters() {
		newParams[p.Name] = p.T
	}
	own := m.Parameters()
	if len(own) != len(newParams) {
		return fmt.Errorf("%d weights, the loaded model has %d: not the same architecture", len(newParams), len(own))
	}
	for _, p := range own {
		src := newParams[p.Name]
		if src == nil {
			return fmt.Errorf("it has no weight %s: not the same architecture", p.Name)
		}
		if a, b := p.T.MustSize(), src.MustSize(); !slices.Equal(a, b) {
			return fmt.Errorf("weight %s has shape %v, the loaded model's is %v", p.Name, b, a)
		}
	}
	err := torch.NoGrad(func() error {
		for _, p := range own {
			p.T.Copy_(newParams[p.Name])
		}
		return nil
	})
	if err != nil {
		return err
	}
	// What finish computed from the configuration: the rotary tables and rms_norm_eps.
	old := m.rope
	m.Config = b
	m.rope = newRope(b, m.dtype)
	if old.cos != nil {
		old.cos.MustDrop()
		old.sin.MustDrop()
	}
	_ = torch.Untracked(func() error {
		eps := ts.MustFull([]int64{1}, ts.FloatScalar(b.RMSNormEps), m.compute, m.device).MustSqueeze(true)
		m.eps.MustDrop()
		m.eps = eps
		return nil
	})
	return nil
}

func fmtID(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// optionsKey is the comparable part of a model's options (all but the activation function, which
// hidden_act decides).
func optionsKey(o *options) string {
	c := *o
	c.act = nil
	return fmt.Sprintf("%+v", c)
}
