package model

import (
	"encoding/json"
	"fmt"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/choice"
)

// InitMoE is the sparse MLP of a randomly initialised mixture-of-experts model (model_type
// qwen3_moe), in config.json's names; a key left unset takes transformers' Qwen3MoeConfig default.
type InitMoE struct {
	NumExperts          *int     `mapstructure:"num_experts"` // 0: every layer dense (the dense counterpart)
	NumExpertsPerTok    int      `mapstructure:"num_experts_per_tok"`
	MoEIntermediateSize int      `mapstructure:"moe_intermediate_size"`
	NormTopKProb        *bool    `mapstructure:"norm_topk_prob"`
	DecoderSparseStep   int      `mapstructure:"decoder_sparse_step"`
	MLPOnlyLayers       []int    `mapstructure:"mlp_only_layers"`
	RouterAuxLossCoef   *float64 `mapstructure:"router_aux_loss_coef"`
	OutputRouterLogits  *bool    `mapstructure:"output_router_logits"`
}

// keys are the keys set, in config.json's names.
func (m InitMoE) keys() map[string]any {
	out := map[string]any{}
	if m.NumExperts != nil {
		out["num_experts"] = *m.NumExperts
	}
	for k, v := range map[string]int{"num_experts_per_tok": m.NumExpertsPerTok,
		"moe_intermediate_size": m.MoEIntermediateSize, "decoder_sparse_step": m.DecoderSparseStep} {
		if v != 0 {
			out[k] = v
		}
	}
	if m.MLPOnlyLayers != nil {
		out["mlp_only_layers"] = m.MLPOnlyLayers
	}
	if m.NormTopKProb != nil {
		out["norm_topk_prob"] = *m.NormTopKProb
	}
	if m.RouterAuxLossCoef != nil {
		out["router_aux_loss_coef"] = *m.RouterAuxLossCoef
	}
	if m.OutputRouterLogits != nil {
		out["output_router_logits"] = *m.OutputRouterLogits
	}
	return out
}

// check refuses the sparse MLP's keys on a family without one; the family checks their values
// (arch.ParseConfig, through ArchConfig).
func (m InitMoE) check(ck *choice.Problems, key, modelType string) {
	if modelType == "qwen3_moe" {
		return
	}
	for k := range m.keys() {
		ck.Bad(key+"."+k, "a mixture-of-experts key, but model_type is %q (use qwen3_moe)", modelType)
	}
}

// ArchConfig is the Hugging Face config of the randomly initialised model: intermediate_size 0 is
// 4 × hidden_size, num_key_value_heads 0 is num_attention_heads, vocab_size 0 is tokVocab (its
// tokenizer's size).
func (in Init) ArchConfig(tokVocab int) (arch.Config, error) {
	or := func(v, dflt int) int {
		if v == 0 {
			return dflt
		}
		return v
	}
	keys := map[string]any{
		"model_type":              in.ModelType,
		"hidden_size":             in.HiddenSize,
		"intermediate_size":       or(in.IntermediateSize, 4*in.HiddenSize),
		"num_hidden_layers":       in.NumHiddenLayers,
		"num_attention_heads":     in.NumAttentionHeads,
		"num_key_value_heads":     or(in.NumKeyValueHeads, in.NumAttentionHeads),
		"vocab_size":              or(in.VocabSize, tokVocab),
		"rope_theta":              in.RopeTheta,
		"tie_word_embeddings":     in.TieWordEmbeddings,
		"max_position_embeddings": in.MaxPosition,
		"initializer_range":       in.InitializerRange,
	}
	for k, v := range in.MoE.keys() {
		keys[k] = v
	}
	raw, err := json.Marshal(keys)
	if err != nil {
		return arch.Config{}, err
	}
	c, err := arch.ParseConfig(raw)
	if err != nil {
		return arch.Config{}, fmt.Errorf("init: %w", err)
	}
	return c, nil
}
