package policy

// LoRA adapters on a frozen base (issue #27): each targeted projection W of a decoder layer gains a
// low-rank term, y = W·x + (alpha/r)·B·A·x, with A [r, in] and B [out, r] per adapter; so may
// lm_head, and the token embeddings (PEFT's embedding LoRA, a projection of the one-hot token).
// In a mixture-of-experts layer, gate_proj, up_proj and down_proj name every expert's (each its own
// A and B, mlp.experts.{j}.gate_proj as PEFT names them); the router is not adapted.
// Several adapters share one base: a forward call chooses an adapter per row (or none), and the
// low-rank terms of all rows are computed at once (multi-LoRA batching), not one forward per
// adapter.
//
// An adapted model is a view of the base (Model.WithAdapter, Model.WithAdapters; loramix.go): it
// shares the base's weights, runs Forward, Score, TrainScore and generation with the adapters
// added, and its Parameters are the adapters' A and B matrices, so that training an adapter is
// training a model whose parameters are its A and B. Adapter folders in PEFT's layout: peft.go.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/torch"
)

// The modules outside the layers (layer −1), by their index in arch.LoRAModules.
var (
	projEmbed = len(arch.LoRATargets)     // embed_tokens: A [r, vocab], B [hidden, r] (PEFT's lora_embedding_A/B)
	projHead  = len(arch.LoRATargets) + 1 // lm_head: A [r, hidden], B [vocab, r]
)

// targetGate is gate_proj's index in arch.LoRATargets (up_proj and down_proj follow).
var targetGate = slices.Index(arch.LoRATargets, "gate_proj")

// Adapter folder files (PEFT's layout).
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
)

// projection is one projection of a decoder layer that an adapter may adapt: its module path in
// the layer (self_attn.q_proj, mlp.up_proj, mlp.experts.3.down_proj), the arch.LoRATargets entry
// that targets it, and the layer itself.
type projection struct {
	path   string
	target int
	lin    *Linear
}

// projShape is a projection as an adapter knows it: path, target and features, no weights.
type projShape struct {
	path    string
	target  int
	in, out int64
}

// projections lists the layer's projections in the order an adapter stores them: q, k, v, o, then
// the MLP's (gate, up, down; each expert's in turn in a mixture of experts).
func (l *decoderLayer) projections() []projection {
	a := &l.SelfAttn
	return append([]projection{{"self_attn.q_proj", 0, &a.QProj}, {"self_attn.k_proj", 1, &a.KProj},
		{"self_attn.v_proj", 2, &a.VProj}, {"self_attn.o_proj", 3, &a.OProj}}, l.MLP.projections()...)
}

// newLayout is the projections of every layer of m as an adapter for it stores them (layers of the
// same kind share one list); nil for a family whose layers take no adapters. skeleton keeps it in
// m.layout.
func newLayout(m *Model) [][]projShape {
	out := make([][]projShape, len(m.Layers))
	byKind := map[bool][]projShape{} // sparse or not
	for i, l := range m.Layers {
		d, ok := l.(*decoderLayer)
		if !ok {
			return nil
		}
		sparse := m.opts.MoE.SparseLayer(i)
		if shapes, ok := byKind[sparse]; ok {
			out[i] = shapes
			continue
		}
		for _, p := range d.projections() {
			out[i] = append(out[i], projShape{p.path, p.target, p.lin.in, p.lin.out})
		}
		byKind[sparse] = out[i]
	}
	return out
}

// projLayout is the projections of every layer of m as an adapter for it stores them.
func (m *Model) projLayout() ([][]projShape, error) {
	if len(m.Layers) == 0 {
		return nil, errors.New("the model has no layers")
	}
	if m.layout == nil {
		return nil, fmt.Errorf("model type %s: its layers cannot take LoRA adapters", m.Config.ModelType)
	}
	return m.layout, nil
}

// sameLayout says whether two layouts (projLayout) are equal: at once when they are one model's.
func sameLayout(a, b [][]projShape) bool {
	if len(a) != len(b) {
		return false
	}
	for l := range a {
		if len(a[l]) != len(b[l]) || (len(a[l]) > 0 && &a[l][0] != &b[l][0] && !slices.Equal(a[l], b[l])) {
			return false
		}
	}
	return true
}

// layoutString sums a layout up for errors: its layers and projections.
func layoutString(layout [][]projShape) string {
	n := 0
	for _, l := range layout {
		n += len(l)
	}
	return fmt.Sprintf("%d layers of %d projections", len(layout), n)
}

// LoRAConfig is an adapter's shape and scale.
type LoRAConfig struct {
	Rank    int      // r
	Alpha   float64  // lora_alpha: the low-rank term is scaled by Alpha/Rank
	Dropout float64  // lora_dropout: only 0 is supported (drmas trains LoRA adapters without dropout)
	Targets []string // module names (arch.LoRAModules); arch.ExpandTargets turns "all-linear" into the projections
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
		errs = append(errs, fmt.Errorf("dropout %v: only 0 is supported (drmas trains LoRA adapters without dropout)", c.Dropout))
	}
	if _, err := arch.ExpandTargets(c.Targets); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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
	layout        [][]projShape  // [layer][projection] (projLayout of the base)
	vocab, hidden int64
	dtype         gotch.DType
	device        gotch.Device
}

// DType and Device are those of the adapter's tensors.
func (a *Adapter) DType() gotch.DType   { return a.dtype }
func (a *Adapter) Device() gotch.Device { return a.device }

// Layers is the number of decoder layers the adapter spans.
func (a *Adapter) Layers() int { return len(a.a) }

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
	cfg.Targets, _ = arch.ExpandTargets(cfg.Targets)
	layout, err := base.projLayout()
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	a := &Adapter{Name: name, Config: cfg, layout: layout, vocab: base.opts.Vocab, hidden: base.opts.Hidden, dtype: dtype, device: base.device}
	a.makeSlots()
	return a, nil
}

// makeSlots makes the adapter's empty [layer][projection] tables for its layout.
func (a *Adapter) makeSlots() {
	a.a = make([][]*ts.Tensor, len(a.layout))
	a.b = make([][]*ts.Tensor, len(a.layout))
	for i, l := range a.layout {
		a.a[i] = make([]*ts.Tensor, len(l))
		a.b[i] = make([]*ts.Tensor, len(l))
	}
}

// targeted says whether the adapter has weights for module proj (an index of arch.LoRAModules).
func (a *Adapter) targeted(proj int) bool {
	return slices.Contains(a.Config.Targets, arch.LoRAModules[proj])
}

// module is one module an adapter targets: projection proj of a layer (an index in its layout), or
// embed_tokens or lm_head (proj projEmbed or projHead, layer −1).
type module struct{ layer, proj int }

// modules lists the targeted modules: each layer's projections, then embed_tokens and lm_head.
func (a *Adapter) modules() []module {
	var out []module
	for l, projs := range a.layout {
		for k, p := range projs {
			if a.targeted(p.target) {
				out = append(out, module{l, k})
			}
		}
	}
	for _, p := range []int{projEmbed, projHead} {
		if a.targeted(p) {
			out = append(out, module{-1, p})
		}
	}
	return out
}

// weight is where A (or B) of module proj of layer lives (layer −1: embed_tokens or lm_head).
func (a *Adapter) weight(layer, proj int, isB bool) **ts.Tensor {
	i := 0
	if isB {
		i = 1
	}
	switch {
	case layer < 0 && proj == projEmbed:
		return &a.emb[i]
	case layer < 0:
		return &a.head[i]
	case isB:
		return &a.b[layer][proj]
	}
	return &a.a[layer][proj]
}

// shape is the shape of A ([r, in]) or B ([out, r]) of module proj of layer; embed_tokens is a
// projection of the one-hot token, in = vocab, out = hidden (PEFT's lora_embedding_A [r, vocab] and
// lora_embedding_B [hidden, r]).
func (a *Adapter) shape(layer, proj int, isB bool) []int64 {
	var in, out int64
	switch {
	case layer < 0 && proj == projEmbed:
		in, out = a.vocab, a.hidden
	case layer < 0:
		in, out = a.hidden, a.vocab
	default:
		in, out = a.layout[layer][proj].in, a.layout[layer][proj].out
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
	mods := a.modules()
	err := placeEach(2*len(mods), a.dtype, a.device, func(i int) (*ts.Tensor, error) {
		m, isB := mods[i/2], i%2 == 1 // A then B of each module
		return make(m.layer, m.proj, isB, a.shape(m.layer, m.proj, isB))
	}, func(i int, t *ts.Tensor) {
		m := mods[i/2]
		*a.weight(m.layer, m.proj, i%2 == 1) = t
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
	err = a.fill(func(l, p int, isB bool, shape []int64) (*ts.Tensor, error) {
		t := ts.MustZeros(shape, gotch.Float, gotch.CPU)
		embed := l < 0 && p == projEmbed
		switch {
		case embed && isB:
			t.MustNormal_(0, 1)
		case !isB && !embed:
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
		for p := range a.a[l] {
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
// base_model.model.model.layers.N.mlp.experts.J.up_proj.lora_B.weight,
// base_model.model.model.embed_tokens.lora_embedding_A, base_model.model.lm_head.lora_B.weight.
func (a *Adapter) peftKey(layer, proj int, isB bool) string {
	if layer < 0 {
		return outerKey(proj, isB)
	}
	ab := "A"
	if isB {
		ab = "B"
	}
	return fmt.Sprintf("base_model.model.model.layers.%d.%s.lora_%s.weight", layer, a.layout[layer][proj].path, ab)
}

// outerKey is peftKey of embed_tokens (projEmbed) or lm_head.
func outerKey(proj int, isB bool) string {
	ab := "A"
	if isB {
		ab = "B"
	}
	if proj == projEmbed {
		return "base_model.model.model.embed_tokens.lora_embedding_" + ab
	}
	return "base_model.model.lm_head.lora_" + ab + ".weight"
}

// Parameters returns the adapter's tensors (A and B of every targeted module) under PEFT's key
// names, sorted by name. They require grad; update them in place under torch.NoGrad.
func (a *Adapter) Parameters() []Param {
	var out []Param
	for _, m := range a.modules() {
		for _, isB := range []bool{false, true} {
			out = append(out, Param{a.peftKey(m.layer, m.proj, isB), *a.weight(m.layer, m.proj, isB)})
		}
	}
	slices.SortFunc(out, func(x, y Param) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// NumParams counts the elements of Parameters.
func (a *Adapter) NumParams() int64 {
	var n int64
	for _, m := range a.modules() {
		for _, isB := range []bool{false, true} {
			s := a.shape(m.layer, m.proj, isB)
			n += s[0] * s[1]
		}
	}
	return n
}

// Clone returns an independent copy of the adapter's tensors (a KL reference). Torch thread.
func (a *Adapter) Clone() (*Adapter, error) {
	c := &Adapter{Name: a.Name, Config: a.Config, BaseModel: a.BaseModel, layout: a.layout, vocab: a.vocab, hidden: a.hidden, dtype: a.dtype, device: a.device}
	c.makeSlots()
	err := c.fill(func(l, p int, isB bool, _ []int64) (*ts.Tensor, error) {
		return (*a.weight(l, p, isB)).MustDetachCopy(false).MustTo(gotch.CPU, true), nil
	})
	return c, err
}

// CopyFrom copies src's weights into a in place (same configuration and shapes). Torch thread.
func (a *Adapter) CopyFrom(src *Adapter) error {
	if a.Config.Rank != src.Config.Rank || !slices.Equal(a.Config.Targets, src.Config.Targets) || !sameLayout(a.layout, src.layout) {
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
	layout, err := base.projLayout()
	if err != nil {
		return nil, err
	}
	if !sameLayout(layout, a.layout) {
		return nil, fmt.Errorf("merge adapter %s: made for %s, the base has %s", a.Name, layoutString(a.layout), layoutString(layout))
	}
	if a.vocab != base.opts.Vocab || a.hidden != base.opts.Hidden {
		return nil, fmt.Errorf("merge adapter %s: made for a vocabulary of %d and hidden size %d, the base has %d and %d", a.Name, a.vocab, a.hidden, base.opts.Vocab, base.opts.Hidden)
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
		var projs []projection // the merged model's projections of layer at
		at := -1
		for _, mod := range a.modules() {
			l, p := mod.layer, mod.proj
			if l >= 0 && l != at {
				projs, at = m.Layers[l].(*decoderLayer).projections(), l
			}
			delta := cast(*a.weight(l, p, true), base.compute).MustMatmul(cast(*a.weight(l, p, false), base.compute), false).MustMulScalar(ts.FloatScalar(a.Config.Scale()), true)
			var w *ts.Tensor
			switch {
			case l < 0 && p == projEmbed:
				w, delta = m.EmbedTokens, delta.MustT(true) // B·A is [hidden, vocab]
			case l < 0:
				w = m.LMHead
			default:
				w = projs[p].lin.Weight
			}
			w.Copy_(delta.MustAdd(cast(w, base.compute), true)) // (cast(w) may be w itself: never consumed)
		}
		return nil
	})
	if err != nil {
		m.Free()
		return nil, err
	}
	return m, nil
}
