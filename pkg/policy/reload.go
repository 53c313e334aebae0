package policy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/torch"
)

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
