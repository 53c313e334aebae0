package arch

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/files"
)

// Config is the subset of a Hugging Face config.json that every family reads. Keys that are absent
// take the transformers defaults of the model type; keys only one family reads (sliding_window …)
// and keys drmas does not know are kept as they were read and written back by MarshalJSON.
type Config struct {
	ModelType             string       `json:"model_type"`
	HiddenSize            int          `json:"hidden_size"`
	IntermediateSize      int          `json:"intermediate_size"`
	NumHiddenLayers       int          `json:"num_hidden_layers"`
	NumAttentionHeads     int          `json:"num_attention_heads"`
	NumKeyValueHeads      int          `json:"num_key_value_heads"`
	HeadDim               int          `json:"head_dim"`
	VocabSize             int          `json:"vocab_size"`
	RMSNormEps            float64      `json:"rms_norm_eps"`
	RopeTheta             float64      `json:"rope_theta"`
	RopeScaling           *RopeScaling `json:"rope_scaling,omitempty"`
	TieWordEmbeddings     bool         `json:"tie_word_embeddings"`
	AttentionBias         bool         `json:"attention_bias"` // bias on q/k/v/o where the family reads it
	MLPBias               bool         `json:"mlp_bias"`       // bias on the MLP where the family reads it
	MaxPositionEmbeddings int          `json:"max_position_embeddings"`
	InitializerRange      float64      `json:"initializer_range"`
	HiddenAct             string       `json:"hidden_act"`
	TorchDType            string       `json:"torch_dtype"`
	BOSTokenID            *int         `json:"bos_token_id,omitempty"`
	EOSTokenIDs           []int        `json:"-"` // eos_token_id: one id or a list
	PadTokenID            *int         `json:"pad_token_id,omitempty"`

	raw map[string]json.RawMessage // the file as read, for keys drmas does not know
}

// RopeScaling is config.json's rope_scaling. Supported types: "default", "linear", "llama3".
type RopeScaling struct {
	RopeType                      string  `json:"rope_type,omitempty"`
	Type                          string  `json:"type,omitempty"` // older spelling of rope_type
	Factor                        float64 `json:"factor,omitempty"`
	LowFreqFactor                 float64 `json:"low_freq_factor,omitempty"`
	HighFreqFactor                float64 `json:"high_freq_factor,omitempty"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings,omitempty"`
}

// Kind is the rope type, whichever key spelled it.
func (r *RopeScaling) Kind() string {
	if r == nil {
		return "default"
	}
	if r.RopeType != "" {
		return r.RopeType
	}
	if r.Type != "" {
		return r.Type
	}
	return "default"
}

// ReadConfig reads and checks a Hugging Face config.json.
func ReadConfig(path string) (Config, error) {
	data, err := files.Read(path, files.MaxConfig)
	if err != nil {
		return Config{}, fmt.Errorf("model config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("model config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig reads config.json text, fills the model type's defaults and checks the result.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return Config{}, err
	}
	c.FillDefaults()
	return c, c.Validate()
}

// UnmarshalJSON reads config.json text as it is (no defaults, no checks: see ParseConfig), keeping
// the keys drmas does not know for MarshalJSON.
func (c *Config) UnmarshalJSON(data []byte) error {
	type plain Config // the same fields without these methods
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	*c = Config(p)
	c.raw = raw
	if v, ok := raw["eos_token_id"]; ok && string(v) != "null" {
		var one int
		if err := json.Unmarshal(v, &one); err == nil {
			c.EOSTokenIDs = []int{one}
		} else if err := json.Unmarshal(v, &c.EOSTokenIDs); err != nil {
			return fmt.Errorf("eos_token_id: want an id or a list of ids, got %s", v)
		}
	}
	if c.TorchDType == "" { // transformers ≥ 4.56 writes "dtype"
		if v, ok := raw["dtype"]; ok {
			_ = json.Unmarshal(v, &c.TorchDType)
		}
	}
	return nil
}

// FillDefaults sets what transformers' config class of the model type defaults to: the family's
// own defaults first, then those every family shares, for what is still unset.
func (c *Config) FillDefaults() {
	if f := lookup(c.ModelType); f != nil && f.Defaults != nil {
		f.Defaults(c)
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if c.HeadDim == 0 && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.InitializerRange == 0 {
		c.InitializerRange = 0.02
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "silu"
	}
	if c.TorchDType == "" {
		c.TorchDType = "float32"
	}
}

// Validate checks that the configuration describes a model drmas can run: the checks every
// family shares, then the family's own.
func (c Config) Validate() error {
	f := lookup(c.ModelType)
	if f == nil {
		return unknownFamily(c.ModelType)
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, f := range []struct {
		key string
		v   int
	}{
		{"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads}, {"head_dim", c.HeadDim}, {"vocab_size", c.VocabSize},
	} {
		if f.v <= 0 {
			bad("%s must be > 0, got %d", f.key, f.v)
		} else if f.v > MaxSizes[f.key] {
			bad("%s %d exceeds the bound %d", f.key, f.v, MaxSizes[f.key])
		}
	}
	for _, f := range []struct {
		key string
		v   float64
	}{{"rope_theta", c.RopeTheta}, {"rms_norm_eps", c.RMSNormEps}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			bad("%s must be a finite number > 0, got %g", f.key, f.v)
		}
	}
	if c.MaxPositionEmbeddings <= 0 {
		bad("max_position_embeddings must be > 0, got %d", c.MaxPositionEmbeddings)
	} else if c.MaxPositionEmbeddings > MaxSizes["max_position_embeddings"] {
		bad("max_position_embeddings %d exceeds the bound %d", c.MaxPositionEmbeddings, MaxSizes["max_position_embeddings"])
	}
	if c.NumKeyValueHeads > 0 && c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		bad("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim%2 != 0 {
		bad("head_dim %d must be even (rotary embeddings)", c.HeadDim)
	}
	if _, err := ParseDType(c.TorchDType); err != nil {
		bad("torch_dtype: %v", err)
	}
	switch k := c.RopeScaling.Kind(); k {
	case "default":
	case "linear":
		if c.RopeScaling.Factor <= 0 {
			bad("rope_scaling.factor must be > 0")
		}
	case "llama3":
		r := c.RopeScaling
		if r.Factor <= 0 || r.LowFreqFactor <= 0 || r.HighFreqFactor <= r.LowFreqFactor || r.OriginalMaxPositionEmbeddings <= 0 {
			bad("rope_scaling (llama3): want factor > 0, 0 < low_freq_factor < high_freq_factor, original_max_position_embeddings > 0")
		}
	default:
		bad("rope_scaling type %q: only default, linear and llama3 are supported", k)
	}
	if f.Check != nil {
		if err := f.Check(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Raw reads a config.json key that has no field in Config (a key only one family reads) into dst.
// It reports whether the key was there and not null.
func (c Config) Raw(key string, dst any) (bool, error) {
	v, ok := c.raw[key]
	if !ok || string(v) == "null" {
		return false, nil
	}
	if err := json.Unmarshal(v, dst); err != nil {
		return true, fmt.Errorf("%s: %w", key, err)
	}
	return true, nil
}

// SetRaw sets a config.json key that has no field in Config; MarshalJSON writes it.
func (c *Config) SetRaw(key string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	c.raw = maps.Clone(c.raw)
	if c.raw == nil {
		c.raw = map[string]json.RawMessage{}
	}
	c.raw[key] = b
}

// has reports whether config.json had key (null included).
func (c Config) has(key string) bool {
	_, ok := c.raw[key]
	return ok
}

// NumParams counts the model's parameters (a tied lm_head counted once); 0 for a configuration no
// family runs.
func (c Config) NumParams() int64 {
	n, _ := ParamCount(c)
	return n
}

// MarshalJSON writes the configuration as config.json: the keys of the file it was read from (if
// any), overwritten with Config's fields.
func (c Config) MarshalJSON() ([]byte, error) {
	out := maps.Clone(c.raw)
	if out == nil {
		out = map[string]json.RawMessage{}
	}
	delete(out, "dtype")
	set := func(k string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		out[k] = b
	}
	if f := lookup(c.ModelType); f != nil {
		set("architectures", []string{f.Architecture})
	}
	set("model_type", c.ModelType)
	set("hidden_size", c.HiddenSize)
	set("intermediate_size", c.IntermediateSize)
	set("num_hidden_layers", c.NumHiddenLayers)
	set("num_attention_heads", c.NumAttentionHeads)
	set("num_key_value_heads", c.NumKeyValueHeads)
	set("head_dim", c.HeadDim)
	set("vocab_size", c.VocabSize)
	set("rms_norm_eps", c.RMSNormEps)
	set("rope_theta", c.RopeTheta)
	if c.RopeScaling != nil {
		set("rope_scaling", c.RopeScaling)
	}
	set("tie_word_embeddings", c.TieWordEmbeddings)
	set("attention_bias", c.AttentionBias)
	if _, ok := out["mlp_bias"]; ok || c.MLPBias {
		set("mlp_bias", c.MLPBias)
	}
	set("max_position_embeddings", c.MaxPositionEmbeddings)
	set("initializer_range", c.InitializerRange)
	set("hidden_act", c.HiddenAct)
	set("torch_dtype", c.TorchDType)
	set("use_cache", true)
	if c.BOSTokenID != nil {
		set("bos_token_id", *c.BOSTokenID)
	}
	switch len(c.EOSTokenIDs) {
	case 0:
	case 1:
		set("eos_token_id", c.EOSTokenIDs[0])
	default:
		set("eos_token_id", c.EOSTokenIDs)
	}
	if c.PadTokenID != nil {
		set("pad_token_id", *c.PadTokenID)
	}
	if _, ok := out["transformers_version"]; !ok {
		set("transformers_version", "4.51.0")
	}
	keys := slices.Sorted(maps.Keys(out))
	var sb strings.Builder
	sb.WriteString("{\n")
	for i, k := range keys {
		kb, _ := json.Marshal(k)
		fmt.Fprintf(&sb, "  %s: %s", kb, out[k])
		if i < len(keys)-1 {
			sb.WriteString(",")
		}
		sb.WriteString("\n")
	}
	sb.WriteString("}\n")
	return []byte(sb.String()), nil
}
