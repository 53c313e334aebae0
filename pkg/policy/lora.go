package policy

// LoRA adapters on a frozen base (issue #27): each targeted projection W of a decoder layer gains a
// low-rank term, y = W·x + (alpha/r)·B·A·x, with A [r, in] and B [out, r] per adapter. Several
// adapters share one base: a forward call chooses an adapter per row (or none), and the low-rank
// terms of all rows are computed at once from their gathered A and B (multi-LoRA batching), not one
// forward per adapter.
//
// An adapted model is a view of the base (Model.WithAdapter, Model.WithAdapters): it shares the
// base's weights, runs Forward, Score, TrainScore and generation with the adapters added, and its
// Parameters are the adapters' A and B matrices, so that training an adapter is training a model
// whose parameters are its A and B.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/files"
	"github.com/drmas/drmas/pkg/policy/modeltype"
	"github.com/drmas/drmas/pkg/torch"
)

// Projections are the linear layers an adapter can target, by their Hugging Face module names, in
// the order an adapter stores them.
var Projections = modeltype.LoRATargets

// AllLinear is the target that names every projection of Projections (as PEFT's "all-linear",
// which leaves out lm_head).
const AllLinear = modeltype.LoRAAllLinear

// Modules are every target an adapter can have, in storage order: Projections, then embed_tokens
// and lm_head, whose module indices are projEmbed and projHead.
var Modules = modeltype.LoRAModules

var (
	projEmbed = len(Projections)     // embed_tokens: A [r, vocab], B [hidden, r] (PEFT's lora_embedding_A/B)
	projHead  = len(Projections) + 1 // lm_head: A [r, hidden], B [vocab, r]
)

// Adapter folder files (PEFT's layout).
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
)

// projModule is the module path of a projection inside a layer (self_attn.q_proj, mlp.up_proj).
// Only for the projections (proj < len(Projections)).
func projModule(proj int) string {
	if proj < 4 {
		return "self_attn." + Projections[proj]
	}
	return "mlp." + Projections[proj]
}

// LoRAConfig is an adapter's shape and scale.
type LoRAConfig struct {
	Rank    int      // r
	Alpha   float64  // lora_alpha: the low-rank term is scaled by Alpha/Rank
	Dropout float64  // lora_dropout: only 0 is supported (training dropout is not implemented)
	Targets []string // module names (Modules); ExpandTargets turns "all-linear" into the projections
	RSLoRA  bool     // use_rslora: the scale is Alpha/sqrt(Rank)
}

// Scale is the factor of the low-rank term: alpha/r (alpha/sqrt(r) with rsLoRA).
func (c LoRAConfig) Scale() float64 {
	if c.RSLoRA {
		return c.Alpha / math.Sqrt(float64(c.Rank))
	}
	return c.Alpha / float64(c.Rank)
}

// Check refuses a rank below 1, a non-finite alpha, dropout other than 0 and unknown targets.
func (c LoRAConfig) Check() error {
	var errs []error
	if c.Rank < 1 {
		errs = append(errs, fmt.Errorf("rank %d: want at least 1", c.Rank))
	}
	if math.IsNaN(c.Alpha) || math.IsInf(c.Alpha, 0) || c.Alpha <= 0 {
		errs = append(errs, fmt.Errorf("alpha %v: want a positive number", c.Alpha))
	}
	if c.Dropout != 0 {
		errs = append(errs, fmt.Errorf("dropout %v: only 0 is supported (LoRA dropout in training is not implemented)", c.Dropout))
	}
	if _, err := ExpandTargets(c.Targets); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ExpandTargets checks target module names and returns them in Modules order, "all-linear"
// standing for every projection (not embed_tokens or lm_head, as in PEFT).
func ExpandTargets(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("target_modules: none given (want %s or some of %s)", AllLinear, strings.Join(Modules, ", "))
	}
	want := map[string]bool{}
	for _, n := range names {
		switch {
		case n == AllLinear:
			for _, p := range Projections {
				want[p] = true
			}
		case slices.Contains(Modules, n):
			want[n] = true
		default:
			return nil, fmt.Errorf("target_modules: %q is not a module an adapter can target (want %s or some of %s)", n, AllLinear, strings.Join(Modules, ", "))
		}
	}
	var out []string
	for _, p := range Modules {
		if want[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

// Adapter is one LoRA adapter for a base model of a given architecture: per layer and targeted
// projection, A [r, in] and B [out, r]; when targeted, embed_tokens' A [r, vocab] and B [hidden, r]
// (a projection of the one-hot token) and lm_head's A [r, hidden] and B [vocab, r]. Its tensors
// require grad (they are what trains); the base's do not need to.
type Adapter struct {
	Name      string
	Config    LoRAConfig // Targets expanded
	BaseModel string     // base_model_name_or_path written to adapter_config.json

	a, b          [][]*ts.Tensor // [layer][projection]; nil where the projection is not targeted
	emb, head     [2]*ts.Tensor  // embed_tokens' and lm_head's A and B; nil when not targeted
	dims          [][2]int64     // [projection]: in, out features
	vocab, hidden int64
	dtype         gotch.DType
	device        gotch.Device
}

// DType and Device are those of the adapter's tensors.
func (a *Adapter) DType() gotch.DType   { return a.dtype }
func (a *Adapter) Device() gotch.Device { return a.device }

// Layers is the number of decoder layers the adapter spans.
func (a *Adapter) Layers() int { return len(a.a) }

// projDims returns the in/out features of each projection of m's layers.
func projDims(m *Model) ([][2]int64, error) {
	if len(m.Layers) == 0 {
		return nil, errors.New("the model has no layers")
	}
	l, ok := m.Layers[0].(*decoderLayer)
	if !ok {
		return nil, fmt.Errorf("model type %s: its layers cannot take LoRA adapters", m.Config.ModelType)
	}
	dims := make([][2]int64, len(Projections))
	for i := range Projections {
		p := l.proj(i)
		dims[i] = [2]int64{p.in, p.out}
	}
	return dims, nil
}

// proj is the layer's projection i (of Projections).
func (l *decoderLayer) proj(i int) *Linear {
	return []*Linear{&l.SelfAttn.QProj, &l.SelfAttn.KProj, &l.SelfAttn.VProj, &l.SelfAttn.OProj,
		&l.MLP.GateProj, &l.MLP.UpProj, &l.MLP.DownProj}[i]
}

// newAdapterShell checks cfg against base and returns an adapter with no tensors yet.
func newAdapterShell(base *Model, name string, cfg LoRAConfig, dtype gotch.DType) (*Adapter, error) {
	if base.lora != nil {
		return nil, fmt.Errorf("adapter %s: the base is itself an adapted model", name)
	}
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	if err := checkDType(dtype); err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	cfg.Targets, _ = ExpandTargets(cfg.Targets)
	dims, err := projDims(base)
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	a := &Adapter{Name: name, Config: cfg, dims: dims, vocab: base.opts.vocab, hidden: base.opts.hidden, dtype: dtype, device: base.device}
	a.a = make([][]*ts.Tensor, len(base.Layers))
	a.b = make([][]*ts.Tensor, len(base.Layers))
	for i := range a.a {
		a.a[i] = make([]*ts.Tensor, len(Projections))
		a.b[i] = make([]*ts.Tensor, len(Projections))
	}
	return a, nil
}

// targeted says whether the adapter has weights for module proj (an index of Modules).
func (a *Adapter) targeted(proj int) bool {
	return slices.Contains(a.Config.Targets, Modules[proj])
}

// modules calls f for every targeted module: each layer's projections, then embed_tokens and
// lm_head (layer −1).
func (a *Adapter) modules(f func(layer, proj int)) {
	for l := range a.a {
		for p := range Projections {
			if a.targeted(p) {
				f(l, p)
			}
		}
	}
	for _, p := range []int{projEmbed, projHead} {
		if a.targeted(p) {
			f(-1, p)
		}
	}
}

// weight is where A (or B) of module proj lives (of layer for a projection).
func (a *Adapter) weight(layer, proj int, isB bool) **ts.Tensor {
	i := 0
	if isB {
		i = 1
	}
	switch {
	case proj == projEmbed:
		return &a.emb[i]
	case proj == projHead:
		return &a.head[i]
	case isB:
		return &a.b[layer][proj]
	}
	return &a.a[layer][proj]
}

// shape is the shape of A ([r, in]) or B ([out, r]) of module proj; embed_tokens is a projection
// of the one-hot token, in = vocab, out = hidden (PEFT's lora_embedding_A [r, vocab] and
// lora_embedding_B [hidden, r]).
func (a *Adapter) shape(proj int, isB bool) []int64 {
	var in, out int64
	switch proj {
	case projEmbed:
		in, out = a.vocab, a.hidden
	case projHead:
		in, out = a.hidden, a.vocab
	default:
		in, out = a.dims[proj][0], a.dims[proj][1]
	}
	if isB {
		return []int64{out, int64(a.Config.Rank)}
	}
	return []int64{int64(a.Config.Rank), in}
}

// fill creates every targeted A and B from make (on the CPU, any float dtype), converted to the
// adapter's dtype and device, requiring grad, owned by the adapter (no open scope). layer is −1
// for embed_tokens and lm_head.
func (a *Adapter) fill(make func(layer, proj int, isB bool, shape []int64) (*ts.Tensor, error)) error {
	err := torch.Untracked(func() error {
		var err error
		a.modules(func(l, p int) {
			for _, isB := range []bool{false, true} {
				if err != nil {
					return
				}
				shape := a.shape(p, isB)
				err = func() error {
					sc := torch.NewScope()
					defer sc.Close()
					t, err := make(l, p, isB, shape)
					if err != nil {
						return err
					}
					if t.DType() != a.dtype {
						t = t.MustTotype(a.dtype, false)
					}
					if a.device != gotch.CPU {
						t = t.MustTo(a.device, false)
					}
					t = t.MustSetRequiresGrad(true, false)
					sc.Keep(t)
					*a.weight(l, p, isB) = t
					return nil
				}()
			}
		})
		return err
	})
	if err != nil {
		a.Free()
	}
	return err
}

// NewAdapter creates an adapter for base with PEFT's initialisation: A from kaiming_uniform(a=√5)
// (uniform in ±1/√in) and B zero; for embed_tokens, as PEFT's embedding LoRA, A zero and B from a
// standard normal. Either way a new adapter computes exactly the base. Random values are drawn on
// the CPU in float32 from a generator seeded with seed (this reseeds libtorch's global generator).
// The tensors are in dtype on the base's device. Torch thread.
func NewAdapter(base *Model, name string, cfg LoRAConfig, dtype gotch.DType, seed int64) (*Adapter, error) {
	a, err := newAdapterShell(base, name, cfg, dtype)
	if err != nil {
		return nil, err
	}
	torch.ManualSeed(seed)
	err = a.fill(func(_, p int, isB bool, shape []int64) (*ts.Tensor, error) {
		t := ts.MustZeros(shape, gotch.Float, gotch.CPU)
		switch {
		case p == projEmbed && isB:
			t.MustNormal_(0, 1)
		case !isB && p != projEmbed:
			bound := 1 / math.Sqrt(float64(shape[1]))
			t.MustUniform_(-bound, bound)
		}
		return t, nil
	})
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	return a, nil
}

// Free releases the adapter's tensors now.
func (a *Adapter) Free() {
	for l := range a.a {
		for p := range Projections {
			for _, isB := range []bool{false, true} {
				if t := a.weight(l, p, isB); *t != nil {
					(*t).MustDrop()
					*t = nil
				}
			}
		}
	}
	for _, t := range []**ts.Tensor{&a.emb[0], &a.emb[1], &a.head[0], &a.head[1]} {
		if *t != nil {
			(*t).MustDrop()
			*t = nil
		}
	}
}

// peftKey is the name PEFT saves a tensor under (without the adapter name):
// base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight,
// base_model.model.model.embed_tokens.lora_embedding_A, base_model.model.lm_head.lora_B.weight.
func peftKey(layer, proj int, isB bool) string {
	ab := "A"
	if isB {
		ab = "B"
	}
	switch proj {
	case projEmbed:
		return "base_model.model.model.embed_tokens.lora_embedding_" + ab
	case projHead:
		return "base_model.model.lm_head.lora_" + ab + ".weight"
	}
	return fmt.Sprintf("base_model.model.model.layers.%d.%s.lora_%s.weight", layer, projModule(proj), ab)
}

// Parameters returns the adapter's tensors (A and B of every targeted module) under PEFT's key
// names, sorted by name. They require grad; update them in place under torch.NoGrad.
func (a *Adapter) Parameters() []Param {
	var out []Param
	a.modules(func(l, p int) {
		out = append(out, Param{peftKey(l, p, false), *a.weight(l, p, false)}, Param{peftKey(l, p, true), *a.weight(l, p, true)})
	})
	slices.SortFunc(out, func(x, y Param) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// NumParams counts the elements of Parameters.
func (a *Adapter) NumParams() int64 {
	var n int64
	a.modules(func(_, p int) {
		for _, isB := range []bool{false, true} {
			s := a.shape(p, isB)
			n += s[0] * s[1]
		}
	})
	return n
}

// LoRAShapes lists the element counts of the A and B tensors of an adapter of rank r on the given
// targets of a model of configuration c (for memory plans), without building anything.
func LoRAShapes(c Config, r int, targets []string) ([]int64, error) {
	t, err := ExpandTargets(targets)
	if err != nil {
		return nil, err
	}
	c.fillDefaults()
	o := newOptions(c)
	q, kv := o.heads*o.headDim, o.kvHeads*o.headDim
	dims := map[string][2]int64{"q_proj": {o.hidden, q}, "k_proj": {o.hidden, kv}, "v_proj": {o.hidden, kv}, "o_proj": {q, o.hidden},
		"gate_proj": {o.hidden, o.inter}, "up_proj": {o.hidden, o.inter}, "down_proj": {o.inter, o.hidden}}
	dims[modeltype.LoRAEmbed] = [2]int64{o.vocab, o.hidden}
	dims[modeltype.LoRAHead] = [2]int64{o.hidden, o.vocab}
	var out []int64
	for range c.NumHiddenLayers {
		for _, p := range t {
			if slices.Contains(Projections, p) {
				out = append(out, int64(r)*dims[p][0], int64(r)*dims[p][1])
			}
		}
	}
	for _, p := range t {
		if !slices.Contains(Projections, p) {
			out = append(out, int64(r)*dims[p][0], int64(r)*dims[p][1])
		}
	}
	return out, nil
}

// LoRAParams is the number of adapter parameters of rank r on the given targets of a model of
// configuration c (the sum of LoRAShapes).
func LoRAParams(c Config, r int, targets []string) (int64, error) {
	sizes, err := LoRAShapes(c, r, targets)
	var n int64
	for _, s := range sizes {
		n += s
	}
	return n, err
}

// peftConfig is adapter_config.json as PEFT (0.10 – 0.17) writes it for a LoRA adapter.
type peftConfig struct {
	AlphaPattern        map[string]any `json:"alpha_pattern"`
	AutoMapping         any            `json:"auto_mapping"`
	BaseModelNameOrPath string         `json:"base_model_name_or_path"`
	Bias                string         `json:"bias"`
	FanInFanOut         bool           `json:"fan_in_fan_out"`
	InferenceMode       bool           `json:"inference_mode"`
	InitLoraWeights     bool           `json:"init_lora_weights"`
	LayersPattern       any            `json:"layers_pattern"`
	LayersToTransform   any            `json:"layers_to_transform"`
	LoraAlpha           float64        `json:"lora_alpha"`
	LoraDropout         float64        `json:"lora_dropout"`
	ModulesToSave       []string       `json:"modules_to_save"`
	PeftType            string         `json:"peft_type"`
	R                   int            `json:"r"`
	RankPattern         map[string]any `json:"rank_pattern"`
	Revision            any            `json:"revision"`
	TargetModules       []string       `json:"target_modules"`
	TaskType            string         `json:"task_type"`
	UseDora             bool           `json:"use_dora"`
	UseRSLoRA           bool           `json:"use_rslora"`
}

// Save writes the adapter to dir in PEFT's layout: adapter_config.json and
// adapter_model.safetensors (PEFT's key names, the adapter's dtype), creating dir if needed, each
// file through a temporary one. vLLM, SGLang and PEFT load the folder as it is; this is what a
// serving engine is handed each iteration. Torch thread.
func (a *Adapter) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save adapter %s: %w", a.Name, err)
	}
	var tensors []stTensor
	for _, p := range a.Parameters() {
		t := p.T
		tensors = append(tensors, stTensor{Name: p.Name, DType: a.dtype, Shape: t.MustSize(), Data: func() ([]byte, error) { return tensorBytes(t) }})
	}
	if err := writeSafetensors(filepath.Join(dir, AdapterWeightsFile), tensors, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("save adapter %s: %w", a.Name, err)
	}
	c := a.Config
	js, err := json.MarshalIndent(peftConfig{
		AlphaPattern: map[string]any{}, RankPattern: map[string]any{}, BaseModelNameOrPath: a.BaseModel, Bias: "none",
		InferenceMode: true, InitLoraWeights: true, LoraAlpha: c.Alpha, LoraDropout: c.Dropout, PeftType: "LORA",
		R: c.Rank, TargetModules: c.Targets, TaskType: "CAUSAL_LM", UseRSLoRA: c.RSLoRA,
	}, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteBytes(filepath.Join(dir, AdapterConfigFile), append(js, '\n')); err != nil {
		return fmt.Errorf("save adapter %s: %w", a.Name, err)
	}
	return nil
}

// IsAdapterDir says whether dir holds an adapter (adapter_config.json) rather than a model.
func IsAdapterDir(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, AdapterConfigFile))
	return err == nil
}

// ReadAdapterConfig reads dir/adapter_config.json: the LoRA configuration and
// base_model_name_or_path. Settings this package does not implement (DoRA, biases, fan_in_fan_out,
// per-module rank or alpha patterns, modules_to_save, layer selections, target_modules given as a
// regular expression or naming other modules, dropout other than 0) are refused with an error
// naming the file and the key.
func ReadAdapterConfig(dir string) (LoRAConfig, string, error) {
	path := filepath.Join(dir, AdapterConfigFile)
	data, err := files.Read(path, files.MaxJSON)
	if err != nil {
		return LoRAConfig{}, "", err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return LoRAConfig{}, "", fmt.Errorf("%s: %w", path, err)
	}
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("%s: %s: %s", path, key, fmt.Sprintf(format, args...))
	}
	str := func(key string) (string, bool, error) {
		v, ok := raw[key]
		if !ok || string(v) == "null" {
			return "", false, nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", true, bad(key, "want a string: %v", err)
		}
		return s, true, nil
	}
	var errs []error
	var cfg LoRAConfig
	var base string
	if s, _, err := str("peft_type"); err != nil || s != "LORA" {
		errs = append(errs, cmpErr(err, bad("peft_type", "%q: only LORA adapters are supported", s)))
	}
	if v, ok := raw["r"]; !ok || json.Unmarshal(v, &cfg.Rank) != nil {
		errs = append(errs, bad("r", "missing or not an integer"))
	}
	if v, ok := raw["lora_alpha"]; !ok || json.Unmarshal(v, &cfg.Alpha) != nil {
		errs = append(errs, bad("lora_alpha", "missing or not a number"))
	}
	if v, ok := raw["lora_dropout"]; ok && string(v) != "null" && json.Unmarshal(v, &cfg.Dropout) != nil {
		errs = append(errs, bad("lora_dropout", "not a number"))
	}
	if s, ok, err := str("bias"); err != nil || (ok && s != "none") {
		errs = append(errs, cmpErr(err, bad("bias", "%q: only \"none\" is supported", s)))
	}
	if s, _, err := str("task_type"); err != nil || (s != "" && s != "CAUSAL_LM") {
		errs = append(errs, cmpErr(err, bad("task_type", "%q: want CAUSAL_LM", s)))
	}
	if s, _, err := str("base_model_name_or_path"); err != nil {
		errs = append(errs, err)
	} else {
		base = s
	}
	for _, key := range []string{"fan_in_fan_out", "use_dora", "use_rslora"} {
		v, ok := raw[key]
		if !ok || string(v) == "null" {
			continue
		}
		var b bool
		if err := json.Unmarshal(v, &b); err != nil {
			errs = append(errs, bad(key, "want true or false"))
			continue
		}
		switch {
		case key == "use_rslora":
			cfg.RSLoRA = b
		case b:
			errs = append(errs, bad(key, "true is not supported"))
		}
	}
	for _, key := range []string{"rank_pattern", "alpha_pattern"} {
		if v, ok := raw[key]; ok && string(v) != "null" && string(v) != "{}" {
			var m map[string]any
			if json.Unmarshal(v, &m) != nil || len(m) > 0 {
				errs = append(errs, bad(key, "per-module ranks or alphas are not supported"))
			}
		}
	}
	for _, key := range []string{"modules_to_save", "layers_to_transform", "layers_pattern", "exclude_modules", "trainable_token_indices"} {
		if v, ok := raw[key]; ok && string(v) != "null" && string(v) != "[]" {
			errs = append(errs, bad(key, "%s is not supported (want null)", v))
		}
	}
	if v, ok := raw["target_modules"]; !ok {
		errs = append(errs, bad("target_modules", "missing"))
	} else {
		var list []string
		var one string
		switch {
		case json.Unmarshal(v, &list) == nil:
		case json.Unmarshal(v, &one) == nil && one == AllLinear:
			list = []string{one}
		case json.Unmarshal(v, &one) == nil:
			errs = append(errs, bad("target_modules", "%q: a regular expression is not supported (list the projections)", one))
		default:
			errs = append(errs, bad("target_modules", "want a list of module names"))
		}
		if list != nil {
			if cfg.Targets, err = ExpandTargets(list); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", path, err))
			}
		}
	}
	if len(errs) == 0 {
		if err := cfg.Check(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return LoRAConfig{}, "", err
	}
	return cfg, base, nil
}

// cmpErr is err when set, else alt.
func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// loraKey matches a PEFT tensor name of a layer's projection and captures layer, module and A/B.
var loraKey = regexp.MustCompile(`^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.lora_(A|B)\.weight$`)

// outerKeys are the PEFT tensor names of embed_tokens' and lm_head's A and B, and their module.
var outerKeys = map[string]int{
	peftKey(-1, projEmbed, false): projEmbed, peftKey(-1, projEmbed, true): projEmbed,
	peftKey(-1, projHead, false): projHead, peftKey(-1, projHead, true): projHead,
}

// LoadAdapter reads a PEFT adapter folder (adapter_config.json, adapter_model.safetensors; F32,
// BF16, F16 or F64 tensors) as an adapter named name for base, in dtype on the base's device.
// Every tensor the configuration implies must be there with its shape, and no other: errors name
// the file and the key. Torch thread.
func LoadAdapter(dir, name string, base *Model, dtype gotch.DType) (*Adapter, error) {
	cfg, baseName, err := ReadAdapterConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	a, err := newAdapterShell(base, name, cfg, dtype)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	a.BaseModel = baseName
	path := filepath.Join(dir, AdapterWeightsFile)
	st, err := openSafetensors(path)
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	defer st.Close()
	var errs []error
	var copies []string // PEFT's copies of the base's embedding matrices (save_embedding_layers)
	for key := range st.entries {
		if _, ok := baseCopyKeys[key]; ok {
			copies = append(copies, key)
			continue
		}
		if p, ok := outerKeys[key]; ok {
			if !a.targeted(p) {
				errs = append(errs, fmt.Errorf("%s: tensor %s: %s is not in target_modules %v of %s", path, key, Modules[p], cfg.Targets, AdapterConfigFile))
			}
			continue
		}
		m := loraKey.FindStringSubmatch(key)
		if m == nil {
			errs = append(errs, fmt.Errorf("%s: tensor %s: not a LoRA weight this package adapts (want base_model.model.model.layers.N.self_attn|mlp.<proj>.lora_A|lora_B.weight, %s or %s)",
				path, key, peftKey(-1, projEmbed, false), peftKey(-1, projHead, false)))
			continue
		}
		l, _ := strconv.Atoi(m[1])
		p := slices.Index(Projections, m[3])
		switch {
		case l >= len(base.Layers):
			errs = append(errs, fmt.Errorf("%s: tensor %s: layer %d, the base has %d layers", path, key, l, len(base.Layers)))
		case p < 0 || projModule(p) != m[2]+"."+m[3]:
			errs = append(errs, fmt.Errorf("%s: tensor %s: %s.%s is not a projection this package adapts", path, key, m[2], m[3]))
		case !a.targeted(p):
			errs = append(errs, fmt.Errorf("%s: tensor %s: %s is not in target_modules %v of %s", path, key, m[3], cfg.Targets, AdapterConfigFile))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	err = a.fill(func(l, p int, isB bool, shape []int64) (*ts.Tensor, error) {
		data, dt, err := st.read(peftKey(l, p, isB), shape)
		if err != nil {
			return nil, err
		}
		return ts.OfDataSize(data, shape, dt)
	})
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	for _, key := range copies {
		if err := checkBaseCopy(st, path, key, base); err != nil {
			a.Free()
			return nil, err
		}
	}
	return a, nil
}

// baseCopyKeys are the names under which PEFT saves, beside an adapter that targets embed_tokens
// or lm_head, a copy of the base's embedding matrix itself (save_embedding_layers="auto"), and
// which one each is.
var baseCopyKeys = map[string]string{
	"base_model.model.model.embed_tokens.base_layer.weight": "embed_tokens",
	"base_model.model.lm_head.base_layer.weight":            "lm_head",
}

// checkBaseCopy checks PEFT's copy of a base embedding matrix against the base's own: drmas uses
// the base's, so a copy that differs (an adapter trained on a resized or retrained vocabulary) is
// refused rather than silently dropped. Equal within 1% of the largest weight (a bfloat16 copy).
func checkBaseCopy(st *stFile, path, key string, base *Model) error {
	w := base.EmbedTokens
	if baseCopyKeys[key] == "lm_head" {
		w = base.LMHead
	}
	shape := w.MustSize()
	data, dt, err := st.read(key, shape)
	if err != nil {
		return err
	}
	return torch.NoGrad(func() error {
		s := torch.NewScope()
		defer s.Close()
		c, err := ts.OfDataSize(data, shape, dt)
		if err != nil {
			return err
		}
		wf := w.MustTotype(gotch.Double, false).MustTo(gotch.CPU, true)
		diff := c.MustTotype(gotch.Double, true).MustSub(wf, true).MustAbs(true).MustMax(true).Float64Values()[0]
		if top := wf.MustAbs(false).MustMax(true).Float64Values()[0]; diff > 0.01*top {
			return fmt.Errorf("%s: tensor %s: differs from the base's %s by up to %.3g (its largest weight is %.3g): an adapter trained on another vocabulary or embedding is not supported",
				path, key, baseCopyKeys[key], diff, top)
		}
		return nil
	})
}

// Clone returns an independent copy of the adapter's tensors (a KL reference). Torch thread.
func (a *Adapter) Clone() (*Adapter, error) {
	c := &Adapter{Name: a.Name, Config: a.Config, BaseModel: a.BaseModel, dims: a.dims, vocab: a.vocab, hidden: a.hidden, dtype: a.dtype, device: a.device}
	c.a = make([][]*ts.Tensor, len(a.a))
	c.b = make([][]*ts.Tensor, len(a.b))
	for i := range c.a {
		c.a[i] = make([]*ts.Tensor, len(Projections))
		c.b[i] = make([]*ts.Tensor, len(Projections))
	}
	err := c.fill(func(l, p int, isB bool, _ []int64) (*ts.Tensor, error) {
		return (*a.weight(l, p, isB)).MustDetachCopy(false).MustTo(gotch.CPU, true), nil
	})
	return c, err
}

// CopyFrom copies src's weights into a in place (same configuration and shapes). Torch thread.
func (a *Adapter) CopyFrom(src *Adapter) error {
	if a.Config.Rank != src.Config.Rank || !slices.Equal(a.Config.Targets, src.Config.Targets) || len(a.a) != len(src.a) {
		return fmt.Errorf("adapter %s: r %d, targets %v, %d layers; the other has r %d, targets %v, %d layers", a.Name,
			a.Config.Rank, a.Config.Targets, len(a.a), src.Config.Rank, src.Config.Targets, len(src.a))
	}
	mine, theirs := a.Parameters(), src.Parameters()
	return torch.NoGrad(func() error {
		for i, p := range mine {
			if !slices.Equal(p.T.MustSize(), theirs[i].T.MustSize()) {
				return fmt.Errorf("adapter %s: %s has shape %v, the other's %v", a.Name, p.Name, p.T.MustSize(), theirs[i].T.MustSize())
			}
			p.T.Copy_(theirs[i].T)
		}
		return nil
	})
}

// Merge returns a plain model (no adapter): a copy of base with W + scale·B·A in every targeted
// projection (lm_head likewise, and embed_tokens + scale·(B·A)ᵀ; a tied base whose embed_tokens or
// lm_head is adapted becomes an untied model), computed in float32 (float64 for a float64 base) and stored in the base's dtype. Save
// it as a Hugging Face folder for export. base must be the model the adapter was made for. Torch
// thread.
func (a *Adapter) Merge(base *Model) (*Model, error) {
	base = base.Base()
	dims, err := projDims(base)
	if err != nil {
		return nil, err
	}
	if len(base.Layers) != len(a.a) || !slices.Equal(dims, a.dims) {
		return nil, fmt.Errorf("merge adapter %s: made for %d layers of projections %v, the base has %d layers of %v", a.Name, len(a.a), a.dims, len(base.Layers), dims)
	}
	if a.vocab != base.opts.vocab || a.hidden != base.opts.hidden {
		return nil, fmt.Errorf("merge adapter %s: made for a vocabulary of %d and hidden size %d, the base has %d and %d", a.Name, a.vocab, a.hidden, base.opts.vocab, base.opts.hidden)
	}
	// A tied base whose embed_tokens or lm_head is adapted merges into an untied model: each side
	// has its own term.
	c := base.Config
	c.TieWordEmbeddings = c.TieWordEmbeddings && a.emb[0] == nil && a.head[0] == nil
	m, err := base.cloneWith(c)
	if err != nil {
		return nil, err
	}
	err = torch.NoGrad(func() error {
		s := torch.NewScope()
		defer s.Close()
		add := func(w *ts.Tensor, l, p int) {
			delta := cast(*a.weight(l, p, true), base.compute).MustMatmul(cast(*a.weight(l, p, false), base.compute), false).MustMulScalar(ts.FloatScalar(a.Config.Scale()), true)
			if p == projEmbed { // B·A is [hidden, vocab]
				delta = delta.MustT(true)
			}
			w.Copy_(delta.MustAdd(cast(w, base.compute), true)) // (cast(w) may be w itself: never consumed)
		}
		a.modules(func(l, p int) {
			switch p {
			case projEmbed:
				add(m.EmbedTokens, l, p)
			case projHead:
				add(m.LMHead, l, p)
			default:
				add(m.Layers[l].(*decoderLayer).proj(p).Weight, l, p)
			}
		})
		return nil
	})
	if err != nil {
		m.free()
		return nil, err
	}
	return m, nil
}

// loraMix is an adapted model's choice of adapters: row i of a forward call runs on
// adapters[rows[i]], on the base alone where rows[i] < 0; rows nil puts every row on adapters[0].
type loraMix struct {
	root     *Model // the base (no adapters)
	adapters []*Adapter
	rows     []int
}

// WithAdapter is m with every row on adapter a: a view sharing m's weights whose Forward, Score,
// TrainScore and generation add a's low-rank terms and whose Parameters are a's. Torch thread not
// needed.
func (m *Model) WithAdapter(a *Adapter) (*Model, error) { return m.WithAdapters([]*Adapter{a}, nil) }

// WithAdapters is m with a per-row adapter choice (multi-LoRA batching): row i of each forward
// call on the view runs on adapters[rows[i]], on the base alone where rows[i] is −1; rows nil puts
// every row on adapters[0] (any batch size). Calls on the view must then have len(rows) rows. The
// adapters must have been made for m's architecture. A view copies the base's constants (rotary
// tables, rms_norm_eps): after a Reload of the base, make its views again (generation makes its
// own per batch).
func (m *Model) WithAdapters(adapters []*Adapter, rows []int) (*Model, error) {
	root := m.Base()
	dims, err := projDims(root)
	if err != nil {
		return nil, err
	}
	for _, a := range adapters {
		if a == nil {
			return nil, errors.New("WithAdapters: nil adapter")
		}
		if len(a.a) != len(root.Layers) || !slices.Equal(a.dims, dims) || a.vocab != root.opts.vocab {
			return nil, fmt.Errorf("adapter %s: made for %d layers of projections %v and a vocabulary of %d, the base has %d layers of %v and %d",
				a.Name, len(a.a), a.dims, a.vocab, len(root.Layers), dims, root.opts.vocab)
		}
		if a.device != root.device {
			return nil, fmt.Errorf("adapter %s: on %v, the base on %v", a.Name, a.device, root.device)
		}
	}
	if rows == nil && len(adapters) == 0 {
		return root, nil
	}
	for i, r := range rows {
		if r < -1 || r >= len(adapters) {
			return nil, fmt.Errorf("WithAdapters: row %d: adapter %d of %d", i, r, len(adapters))
		}
	}
	v := *root
	v.lora = &loraMix{root: root, adapters: adapters, rows: rows}
	return &v, nil
}

// Base is the model without adapters: m itself unless m is an adapted view.
func (m *Model) Base() *Model {
	if m.lora != nil {
		return m.lora.root
	}
	return m
}

// Adapter is the adapter of a view made by WithAdapter (every row on one adapter); nil otherwise.
func (m *Model) Adapter() *Adapter {
	if m.lora != nil && m.lora.rows == nil && len(m.lora.adapters) == 1 {
		return m.lora.adapters[0]
	}
	return nil
}

// withRows is m's view for the rows [lo, hi) of its choice (for micro-batches).
func (m *Model) withRows(lo, hi int) *Model {
	if m.lora == nil || m.lora.rows == nil {
		return m
	}
	v := *m
	mix := *m.lora
	mix.rows = m.lora.rows[lo:hi]
	v.lora = &mix
	return &v
}

// loraPass is a forward call's adapter state: which adapter each row uses.
type loraPass struct {
	mix     *loraMix
	uniform int        // ≥ 0: every row uses adapters[uniform]
	idx     *ts.Tensor // otherwise: [B] int64, each row's slot in the stacked weights (len(adapters): none)
	used    []int      // otherwise: the adapters the rows use, in order
}

// newLoraPass prepares the adapter state of a forward call of B rows; nil when no row has an adapter.
func newLoraPass(mix *loraMix, B int64, dev gotch.Device) *loraPass {
	if mix == nil {
		return nil
	}
	if mix.rows == nil {
		return &loraPass{mix: mix, uniform: 0}
	}
	if int64(len(mix.rows)) != B {
		panic(fmt.Sprintf("policy: a forward call of %d rows on a view with an adapter choice for %d", B, len(mix.rows)))
	}
	first, same := mix.rows[0], true
	for _, r := range mix.rows {
		same = same && r == first
	}
	if same {
		if first < 0 {
			return nil
		}
		return &loraPass{mix: mix, uniform: first}
	}
	lp := &loraPass{mix: mix, uniform: -1}
	slot := map[int]int64{}
	for _, r := range mix.rows {
		if _, ok := slot[r]; r >= 0 && !ok {
			slot[r] = int64(len(lp.used))
			lp.used = append(lp.used, r)
		}
	}
	idx := make([]int64, B)
	for i, r := range mix.rows {
		idx[i] = int64(len(lp.used)) // the zero slot
		if r >= 0 {
			idx[i] = slot[r]
		}
	}
	lp.idx = ts.MustOfSlice(idx).MustTo(dev, true)
	return lp
}

// delta is the low-rank term of projection proj of layer for the rows' adapters, [B, T, out] in
// x's dtype, or nil when no row's adapter targets it. x is the projection's input [B, T, in].
func (lp *loraPass) delta(layer, proj int, x *ts.Tensor) *ts.Tensor {
	if lp == nil {
		return nil
	}
	dt := x.DType()
	if lp.uniform >= 0 {
		a := lp.mix.adapters[lp.uniform]
		A, B := a.a[layer][proj], a.b[layer][proj]
		if A == nil {
			return nil
		}
		h := ts.MustLinear(x, cast(A, dt), ts.None)
		return ts.MustLinear(h, cast(B, dt), ts.None).MustMulScalar(ts.FloatScalar(a.Config.Scale()), true)
	}
	// Mixed rows: stack the used adapters' A [r, in] and scale·B [out, r] (padded to the largest
	// rank with zeros, which add nothing), plus a zero slot for rows on no adapter, and gather
	// each row's.
	var rmax int64
	found := false
	for _, i := range lp.used {
		if a := lp.mix.adapters[i]; a.a[layer][proj] != nil {
			rmax, found = max(rmax, int64(a.Config.Rank)), true
		}
	}
	if !found {
		return nil
	}
	in, out := lp.mix.adapters[lp.used[0]].dims[proj][0], lp.mix.adapters[lp.used[0]].dims[proj][1]
	var as, bs []*ts.Tensor
	for _, i := range lp.used {
		a := lp.mix.adapters[i]
		A, B := a.a[layer][proj], a.b[layer][proj]
		if A == nil {
			as = append(as, ts.MustZeros([]int64{rmax, in}, dt, x.MustDevice()))
			bs = append(bs, ts.MustZeros([]int64{out, rmax}, dt, x.MustDevice()))
			continue
		}
		A, B = cast(A, dt), cast(B, dt).MustMulScalar(ts.FloatScalar(a.Config.Scale()), false)
		if r := int64(a.Config.Rank); r < rmax {
			A = A.MustConstantPadNdWithVal([]int64{0, 0, 0, rmax - r}, ts.FloatScalar(0), false)
			B = B.MustConstantPadNdWithVal([]int64{0, rmax - r}, ts.FloatScalar(0), true)
		}
		as, bs = append(as, A), append(bs, B)
	}
	as = append(as, ts.MustZeros([]int64{rmax, in}, dt, x.MustDevice()))
	bs = append(bs, ts.MustZeros([]int64{out, rmax}, dt, x.MustDevice()))
	rowA := ts.MustStack(as, 0).MustIndexSelect(0, lp.idx, true) // [B, rmax, in]
	rowB := ts.MustStack(bs, 0).MustIndexSelect(0, lp.idx, true) // [B, out, rmax]
	h := x.MustMatmul(rowA.MustTranspose(1, 2, true), false)     // [B, T, rmax]
	return h.MustMatmul(rowB.MustTranspose(1, 2, true), true)    // [B, T, out]
}

// outer is the low-rank term of embed_tokens or lm_head (proj) for the entries of a forward call,
// or nil when no entry's adapter targets it. first(A) is the input's product with an adapter's A,
// [n, …, r] (for lm_head: h·Aᵀ; for embed_tokens: the rows of Aᵀ the token ids pick); rows [n] is
// the batch row of each of the n entries (nil: the entries are the rows). Mixed rows: each used
// adapter's first product is zeroed on the entries of other adapters and all are concatenated
// along the rank, with their scaled B side by side, so that one matmul gives every entry its own
// adapter's term (no [n, out, r] gather, which for lm_head would be vocabulary-sized).
func (lp *loraPass) outer(proj int, rows *ts.Tensor, dt gotch.DType, first func(A *ts.Tensor) *ts.Tensor) *ts.Tensor {
	if lp == nil {
		return nil
	}
	if lp.uniform >= 0 {
		a := lp.mix.adapters[lp.uniform]
		A, B := *a.weight(-1, proj, false), *a.weight(-1, proj, true)
		if A == nil {
			return nil
		}
		return ts.MustLinear(first(cast(A, dt)), cast(B, dt), ts.None).MustMulScalar(ts.FloatScalar(a.Config.Scale()), true)
	}
	slots := lp.idx
	if rows != nil {
		slots = lp.idx.MustIndexSelect(0, rows, false)
	}
	var hs, bs []*ts.Tensor
	for k, i := range lp.used {
		a := lp.mix.adapters[i]
		A, B := *a.weight(-1, proj, false), *a.weight(-1, proj, true)
		if A == nil {
			continue
		}
		h := first(cast(A, dt)) // [n, …, r]
		shape := make([]int64, h.Dim())
		for j := range shape {
			shape[j] = 1
		}
		shape[0] = -1
		mask := slots.MustEq(ts.IntScalar(int64(k)), false).MustTotype(dt, true).MustView(shape, true)
		hs = append(hs, h.MustMul(mask, true))
		bs = append(bs, cast(B, dt).MustMulScalar(ts.FloatScalar(a.Config.Scale()), false))
	}
	if len(hs) == 0 {
		return nil
	}
	return ts.MustLinear(ts.MustCat(hs, -1), ts.MustCat(bs, 1), ts.None)
}

// embedDelta is embed_tokens' low-rank term for ids [B, T]: [B, T, hidden] in dt, or nil.
func (lp *loraPass) embedDelta(ids *ts.Tensor, dt gotch.DType) *ts.Tensor {
	return lp.outer(projEmbed, nil, dt, func(A *ts.Tensor) *ts.Tensor {
		return ts.MustEmbedding(A.MustT(false), ids, -1, false, false)
	})
}

// headDelta is lm_head's low-rank term for hidden states h [n, …, hidden] whose entries belong to
// the batch rows rows [n] (nil: the entries are the rows), or nil.
func (lp *loraPass) headDelta(h, rows *ts.Tensor) *ts.Tensor {
	return lp.outer(projHead, rows, h.DType(), func(A *ts.Tensor) *ts.Tensor { return ts.MustLinear(h, A, ts.None) })
}

// targets says whether any of the mix's adapters targets module proj.
func (mix *loraMix) targets(proj int) bool {
	if mix == nil {
		return false
	}
	for _, a := range mix.adapters {
		if a.targeted(proj) {
			return true
		}
	}
	return false
}

// addDelta is y + the low-rank term of projection proj on input x (y itself when none).
func addDelta(y *ts.Tensor, p *pass, proj int, x *ts.Tensor) *ts.Tensor {
	if p == nil || p.lora == nil {
		return y
	}
	if d := p.lora.delta(p.layer, proj, x); d != nil {
		return y.MustAdd(d, true)
	}
	return y
}

// parameters are the view's adapters' tensors (see Model.Parameters).
func (mix *loraMix) parameters() []Param {
	if len(mix.adapters) == 1 {
		return mix.adapters[0].Parameters()
	}
	var out []Param
	for _, a := range mix.adapters {
		for _, p := range a.Parameters() {
			out = append(out, Param{a.Name + "/" + p.Name, p.T})
		}
	}
	slices.SortFunc(out, func(x, y Param) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// withRowAdapters is the model generation runs for rows: m (the base, maybe in the decoding
// layout) as it is when no row has an adapter, else a view of it with each row's adapter. The view
// is a copy of its own, which decodeLoop may narrow as rows finish.
func withRowAdapters(m, root *Model, rows []*row) (*Model, error) {
	var adapters []*Adapter
	choice := make([]int, len(rows))
	for i, r := range rows {
		choice[i] = -1
		if r.adapter == nil {
			continue
		}
		k := slices.Index(adapters, r.adapter)
		if k < 0 {
			k = len(adapters)
			adapters = append(adapters, r.adapter)
		}
		choice[i] = k
	}
	if len(adapters) == 0 {
		return m, nil
	}
	dims, err := projDims(root)
	if err != nil {
		return nil, err
	}
	for _, a := range adapters {
		if len(a.a) != len(root.Layers) || !slices.Equal(a.dims, dims) || a.vocab != root.opts.vocab || a.device != root.device {
			return nil, fmt.Errorf("adapter %s: made for %d layers of projections %v and a vocabulary of %d on %v, the base has %d layers of %v and %d on %v",
				a.Name, len(a.a), a.dims, a.vocab, a.device, len(root.Layers), dims, root.opts.vocab, root.device)
		}
	}
	v := *m
	v.lora = &loraMix{root: root, adapters: adapters, rows: choice}
	return &v, nil
}

// selectRows is the choice for the rows keep of the batch (nil stays nil).
func (mix *loraMix) selectRows(keep []int64) *loraMix {
	if mix == nil || mix.rows == nil {
		return mix
	}
	c := *mix
	c.rows = make([]int, len(keep))
	for i, k := range keep {
		c.rows[i] = mix.rows[k]
	}
	return &c
}

// Thaw makes the base's weights require grad again (after Freeze), to train the base itself.
func (m *Model) Thaw() {
	for _, s := range m.Base().slots() {
		if *s.ptr != nil {
			(*s.ptr).MustRequiresGrad_(true)
		}
	}
}

// Freeze stops the base's weights from requiring grad, so that training adapters on it gives the
// base no gradient (and autograd keeps nothing for it). Torch thread.
func (m *Model) Freeze() {
	for _, s := range m.Base().slots() {
		if *s.ptr != nil {
			(*s.ptr).MustRequiresGrad_(false)
		}
	}
}
