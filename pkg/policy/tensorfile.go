package policy

import (
	"fmt"
	"slices"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/llm"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

// SaveTensors writes named tensors, each in its own dtype, to a safetensors file (through a temporary
// file) with meta as its __metadata__ (nil: none). The trainer keeps optimizer state this way. Call
// it on the torch thread.
func SaveTensors(path string, names []string, tensors []*ts.Tensor, meta map[string]string) error {
	if len(names) != len(tensors) {
		return fmt.Errorf("save %s: %d names for %d tensors", path, len(names), len(tensors))
	}
	out := make([]stTensor, len(names))
	for i, t := range tensors {
		t := t
		out[i] = stTensor{Name: names[i], DType: t.DType(), Shape: t.MustSize(), Data: func() ([]byte, error) { return torch.Bytes(t) }}
	}
	if err := writeSafetensors(path, out, meta); err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	return nil
}

// TensorSpec is a tensor of a file StreamTensors writes: its name, dtype and shape.
type TensorSpec struct {
	Name  string
	DType gotch.DType
	Shape []int64
}

// StreamTensors is SaveTensors for tensors made as the file is written: next(i) gives tensor i of
// specs when its turn comes (in order), and it is copied out and dropped before the next, so the file
// needs one tensor's memory at a time. Call it on the torch thread.
func StreamTensors(path string, specs []TensorSpec, next func(i int) (*ts.Tensor, error), meta map[string]string) error {
	out := make([]stTensor, len(specs))
	for i, sp := range specs {
		out[i] = stTensor{Name: sp.Name, DType: sp.DType, Shape: sp.Shape, Data: func() ([]byte, error) {
			t, err := next(i)
			if err != nil {
				return nil, err
			}
			defer t.MustDrop()
			return torch.Bytes(t)
		}}
	}
	if err := writeSafetensors(path, out, meta); err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	return nil
}

// LoadTensorsInto reads the named tensors of a safetensors file into dst (same shapes; the dtype is
// converted), in place. A missing tensor or a shape mismatch is an error naming it. Torch thread.
func LoadTensorsInto(path string, names []string, dst []*ts.Tensor) error {
	f, err := openSafetensors(path)
	if err != nil {
		return err
	}
	defer f.Close()
	s := torch.NewScope()
	defer s.Close()
	return torch.NoGrad(func() error {
		for i, name := range names {
			data, dt, err := f.read(name, dst[i].MustSize())
			if err != nil {
				return err
			}
			src, err := ts.OfDataSize(data, dst[i].MustSize(), dt)
			if err != nil {
				return fmt.Errorf("%s: tensor %s: %w", path, name, err)
			}
			dst[i].Copy_(src)
		}
		return nil
	})
}

// Clone returns an independent copy of the model's weights (the KL reference is one). Torch thread.
// An adapted view of one adapter clones the adapter only: the copy is a view of the same base. A
// sharded model (units.go) must be held whole meanwhile.
func (m *Model) Clone() (*Model, error) {
	if m.lora == nil && m.split() {
		return nil, fmt.Errorf("clone: the model's weights are sharded among processes: hold it whole first")
	}
	if m.lora != nil {
		a := m.Adapter()
		if a == nil {
			return nil, fmt.Errorf("clone: a view with several adapters")
		}
		c, err := a.Clone()
		if err != nil {
			return nil, err
		}
		return m.lora.root.WithAdapter(c)
	}
	return m.cloneWith(m.Config)
}

// cloneWith copies m's weights into a new model of configuration cfg: m's own, or m's with its
// tied embeddings untied (lm_head then starts as a copy of the embeddings). Torch thread.
func (m *Model) cloneWith(cfg arch.Config) (*Model, error) {
	src := map[string]*ts.Tensor{}
	for _, s := range m.slots() {
		src[s.name] = *s.ptr
	}
	if m.Config.TieWordEmbeddings && !cfg.TieWordEmbeddings {
		src["lm_head.weight"] = m.EmbedTokens
	}
	c := skeleton(cfg, m.device, m.dtype)
	err := c.build(func(s slot) (*ts.Tensor, error) {
		t, ok := src[s.name]
		if !ok {
			return nil, fmt.Errorf("clone: no tensor %s", s.name)
		}
		return t.MustDetachCopy(false), nil
	})
	return c, err
}

// EncodePrompt renders messages with the chat template (with the generation prompt) and tokenizes
// them, exactly as Generate does for a request without chat-template arguments.
func (p *Policy) EncodePrompt(messages []llm.Message) ([]int, error) {
	return p.EncodePromptWith(messages, nil)
}

// EncodePromptWith is EncodePrompt with chat-template arguments (a request's ChatTemplateKwargs).
func (p *Policy) EncodePromptWith(messages []llm.Message, kwargs map[string]any) ([]int, error) {
	text, err := p.Chat.RenderWith(messages, true, kwargs) // tokenizer.Message is llm.Message
	if err != nil {
		return nil, fmt.Errorf("policy %s: chat template: %w", p.ID, err)
	}
	return p.Tok.Encode(text), nil
}

// EncodeResponse tokenizes a response as generation would have produced it: the text followed by the
// end-of-turn token (the first stop id), unless the text already ends with a stop token.
func (p *Policy) EncodeResponse(text string) []int {
	ids := p.Tok.Encode(text)
	if len(p.StopIDs) > 0 && (len(ids) == 0 || !slices.Contains(p.StopIDs, ids[len(ids)-1])) {
		ids = append(ids, p.StopIDs[0])
	}
	return ids
}
