package policy

// LoRA adapter folders in PEFT's layout (issue #27): adapter_config.json and adapter_model.safetensors,
// written by Adapter.Save and read by LoadAdapter (lora.go has the adapter itself).

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/files"
	"github.com/drmas/drmas/pkg/torch"
)

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
		tensors = append(tensors, stTensor{Name: p.Name, DType: a.dtype, Shape: t.MustSize(), Data: func() ([]byte, error) { return torch.Bytes(t) }})
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
	r := peftReader{path: path}
	if err := json.Unmarshal(data, &r.raw); err != nil {
		return LoRAConfig{}, "", fmt.Errorf("%s: %w", path, err)
	}
	var cfg LoRAConfig
	base := r.scalars(&cfg)
	r.switches(&cfg)
	r.unsupported()
	r.targets(&cfg)
	if len(r.errs) == 0 {
		if err := cfg.Check(); err != nil {
			r.errs = append(r.errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	if err := errors.Join(r.errs...); err != nil {
		return LoRAConfig{}, "", err
	}
	return cfg, base, nil
}

// peftReader reads the keys of an adapter_config.json, gathering what it refuses.
type peftReader struct {
	path string
	raw  map[string]json.RawMessage
	errs []error
}

// bad records an error naming the file and key.
func (r *peftReader) bad(key, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%s: %s: %s", r.path, key, fmt.Sprintf(format, args...)))
}

// str reads a string key: its value and whether it was there and not null.
func (r *peftReader) str(key string) (string, bool, bool) {
	v, ok := r.raw[key]
	if !ok || string(v) == "null" {
		return "", false, true
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		r.bad(key, "want a string: %v", err)
		return "", true, false
	}
	return s, true, true
}

// scalars reads the type, rank, alpha, dropout, bias and task, and returns base_model_name_or_path.
func (r *peftReader) scalars(cfg *LoRAConfig) (base string) {
	if s, _, ok := r.str("peft_type"); ok && s != "LORA" {
		r.bad("peft_type", "%q: only LORA adapters are supported", s)
	}
	if v, ok := r.raw["r"]; !ok || json.Unmarshal(v, &cfg.Rank) != nil {
		r.bad("r", "missing or not an integer")
	}
	if v, ok := r.raw["lora_alpha"]; !ok || json.Unmarshal(v, &cfg.Alpha) != nil {
		r.bad("lora_alpha", "missing or not a number")
	}
	if v, ok := r.raw["lora_dropout"]; ok && string(v) != "null" && json.Unmarshal(v, &cfg.Dropout) != nil {
		r.bad("lora_dropout", "not a number")
	}
	if s, set, ok := r.str("bias"); ok && set && s != "none" {
		r.bad("bias", "%q: only \"none\" is supported", s)
	}
	if s, _, ok := r.str("task_type"); ok && s != "" && s != "CAUSAL_LM" {
		r.bad("task_type", "%q: want CAUSAL_LM", s)
	}
	base, _, _ = r.str("base_model_name_or_path")
	return base
}

// switches reads use_rslora, and refuses fan_in_fan_out and use_dora set to true.
func (r *peftReader) switches(cfg *LoRAConfig) {
	for _, key := range []string{"fan_in_fan_out", "use_dora", "use_rslora"} {
		v, ok := r.raw[key]
		if !ok || string(v) == "null" {
			continue
		}
		var b bool
		if err := json.Unmarshal(v, &b); err != nil {
			r.bad(key, "want true or false")
			continue
		}
		switch {
		case key == "use_rslora":
			cfg.RSLoRA = b
		case b:
			r.bad(key, "true is not supported")
		}
	}
}

// unsupported refuses per-module patterns, modules_to_save and layer selections.
func (r *peftReader) unsupported() {
	for _, key := range []string{"rank_pattern", "alpha_pattern"} {
		if v, ok := r.raw[key]; ok && string(v) != "null" && string(v) != "{}" {
			var m map[string]any
			if json.Unmarshal(v, &m) != nil || len(m) > 0 {
				r.bad(key, "per-module ranks or alphas are not supported")
			}
		}
	}
	for _, key := range []string{"modules_to_save", "layers_to_transform", "layers_pattern", "exclude_modules", "trainable_token_indices"} {
		if v, ok := r.raw[key]; ok && string(v) != "null" && string(v) != "[]" {
			r.bad(key, "%s is not supported (want null)", v)
		}
	}
}

// targets reads target_modules: a list of module names, or "all-linear".
func (r *peftReader) targets(cfg *LoRAConfig) {
	v, ok := r.raw["target_modules"]
	if !ok {
		r.bad("target_modules", "missing")
		return
	}
	var list []string
	var one string
	switch {
	case json.Unmarshal(v, &list) == nil:
	case json.Unmarshal(v, &one) == nil && one == arch.LoRAAllLinear:
		list = []string{one}
	case json.Unmarshal(v, &one) == nil:
		r.bad("target_modules", "%q: a regular expression is not supported (list the projections)", one)
	default:
		r.bad("target_modules", "want a list of module names")
	}
	if list != nil {
		var err error
		if cfg.Targets, err = arch.ExpandTargets(list); err != nil {
			r.errs = append(r.errs, fmt.Errorf("%s: %w", r.path, err))
		}
	}
}

// loraKey matches a PEFT tensor name of a layer's projection and captures layer, module path
// (self_attn.q_proj, mlp.experts.3.up_proj) and its last name.
var loraKey = regexp.MustCompile(`^base_model\.model\.model\.layers\.(\d+)\.((?:self_attn|mlp)\.(?:experts\.\d+\.)?([a-z_]+))\.lora_(A|B)\.weight$`)

// outerKeys are the PEFT tensor names of embed_tokens' and lm_head's A and B, and their module.
var outerKeys = map[string]int{
	outerKey(projEmbed, false): projEmbed, outerKey(projEmbed, true): projEmbed,
	outerKey(projHead, false): projHead, outerKey(projHead, true): projHead,
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
	copies, err := checkAdapterKeys(st, path, a, len(base.Layers))
	if err != nil {
		return nil, err
	}
	err = a.fill(func(l, p int, isB bool, shape []int64) (*ts.Tensor, error) {
		data, dt, err := st.read(a.peftKey(l, p, isB), shape)
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

// checkAdapterKeys checks that every tensor of an adapter file (path) is a LoRA weight of a targeted
// module of a (made for a base of layers layers), and returns the names of PEFT's copies of the
// base's embedding matrices among them. Errors name the file and the tensor.
func checkAdapterKeys(st *stFile, path string, a *Adapter, layers int) (copies []string, err error) {
	var errs []error
	paths := map[string]int{} // a layer's module paths, by the layout they belong to
	var pathsOf []projShape
	for key := range st.entries {
		if _, ok := baseCopyKeys[key]; ok {
			copies = append(copies, key)
			continue
		}
		if p, ok := outerKeys[key]; ok {
			if !a.targeted(p) {
				errs = append(errs, fmt.Errorf("%s: tensor %s: %s is not in target_modules %v of %s", path, key, arch.LoRAModules[p], a.Config.Targets, AdapterConfigFile))
			}
			continue
		}
		m := loraKey.FindStringSubmatch(key)
		if m == nil {
			errs = append(errs, fmt.Errorf("%s: tensor %s: not a LoRA weight this package adapts (want base_model.model.model.layers.N.self_attn|mlp.<proj>.lora_A|lora_B.weight, %s or %s)",
				path, key, outerKey(projEmbed, false), outerKey(projHead, false)))
			continue
		}
		l, _ := strconv.Atoi(m[1])
		if l >= layers {
			errs = append(errs, fmt.Errorf("%s: tensor %s: layer %d, the base has %d layers", path, key, l, layers))
			continue
		}
		if len(a.layout[l]) > 0 && (len(pathsOf) == 0 || &pathsOf[0] != &a.layout[l][0]) {
			pathsOf, paths = a.layout[l], map[string]int{}
			for k, p := range pathsOf {
				paths[p.path] = k
			}
		}
		k, ok := paths[m[2]]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: tensor %s: %s is not a projection this package adapts in layer %d", path, key, m[2], l))
		case !a.targeted(a.layout[l][k].target):
			errs = append(errs, fmt.Errorf("%s: tensor %s: %s is not in target_modules %v of %s", path, key, m[3], a.Config.Targets, AdapterConfigFile))
		}
	}
	return copies, errors.Join(errs...)
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
		c, err := ts.OfDataSize(data, shape, dt) // on the CPU, in the file's dtype
		if err != nil {
			return err
		}
		// Row chunks of 4,096 compared on the CPU in float32: a 152k × 3,584 vocabulary is never
		// copied whole onto the base's device or into float64.
		var diff, top float64
		for lo := int64(0); lo < shape[0]; lo += 4096 {
			n := min(4096, shape[0]-lo)
			cs := torch.NewScope()
			wc := w.MustNarrow(0, lo, n, false).MustTo(gotch.CPU, true).MustTotype(gotch.Float, true)
			cc := c.MustNarrow(0, lo, n, false).MustTotype(gotch.Float, true)
			diff = max(diff, cc.MustSub(wc, true).MustAbs(true).MustMax(true).Float64Values()[0])
			top = max(top, wc.MustAbs(true).MustMax(true).Float64Values()[0])
			cs.Close()
		}
		if diff > 0.01*top {
			return fmt.Errorf("%s: tensor %s: differs from the base's %s by up to %.3g (its largest weight is %.3g): an adapter trained on another vocabulary or embedding is not supported",
				path, key, baseCopyKeys[key], diff, top)
		}
		return nil
	})
}
