package policy

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
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
	m := &Model{Config: cfg, opts: newOptions(cfg), dtype: dt, device: dev, compute: gotch.Float, hook: &unitHook{}}
	if dt == gotch.Double {
		m.compute = gotch.Double
	}
	m.Layers = make([]layer, cfg.NumHiddenLayers)
	for i := range m.Layers {
		m.Layers[i] = newDecoderLayer(m.opts, i)
	}
	m.Norm = newNorm(m.opts)
	m.layout = newLayout(m)
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

// build fills every slot with fill's tensor (created on the CPU in any float dtype), converted to
// the model's dtype and device and marked as requiring grad. The weights are owned by the model,
// not by any open torch scope.
func (m *Model) build(fill func(s slot) (*ts.Tensor, error)) error {
	slots := m.slots()
	err := placeEach(len(slots), m.dtype, m.device,
		func(i int) (*ts.Tensor, error) { return fill(slots[i]) },
		func(i int, t *ts.Tensor) { *slots[i].ptr = t })
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
