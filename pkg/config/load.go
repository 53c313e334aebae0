package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/files"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/team"
	"github.com/spf13/viper"
	"gopkg.in/yaml.v3"
)

// EnvPrefix starts the environment variables that override config keys: DRMAS_RUN_STEPS=10 sets
// run.steps (dots become underscores; list entries by index: DRMAS_MODELS_0_OPTIM_LR=1e-5).
const EnvPrefix = "DRMAS_"

// MaxFileSize bounds a config file: configs are a few kilobytes, and a bound keeps a mistaken
// --config /dev/zero or a huge file from exhausting memory.
const MaxFileSize = files.MaxConfig

// Load reads a run config file, applies DRMAS_ environment overrides and then the --set overrides
// ("key.path=value", list entries by index: "models.0.optim.lr=1e-5"; the value is YAML), decodes it
// strictly over the defaults and validates it. Every error names the file and the key, and says
// when the bad value came from --set or the environment.
func Load(path string, sets []string) (*Config, error) {
	raw, err := readYAML(path)
	if err != nil {
		return nil, err
	}
	from := origins{}
	if err := applyEnv(raw, os.Environ(), from); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, s := range sets {
		if err := applySet(raw, s, from); err != nil {
			return nil, err
		}
	}
	if nulls := nullKeys(raw, ""); len(nulls) > 0 {
		var ps []string
		for _, k := range nulls {
			ps = append(ps, k+": no value (write '' for an empty string, or leave the key out for its default)")
		}
		return nil, from.annotate(path, ps)
	}
	cfg, err := decode(raw)
	if err != nil {
		return nil, from.annotate(path, problems(err))
	}
	cfg.Source = path
	if err := cfg.Validate(); err != nil {
		return nil, from.annotate(path, problems(err))
	}
	for _, w := range cfg.Warnings() {
		log.Warn().Str("config", path).Msg(w)
	}
	return cfg, nil
}

// applySet applies one --set key=value.
func applySet(raw map[string]any, s string, from origins) error {
	key, val, ok := strings.Cut(s, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		return fmt.Errorf("--set %q: want key=value", s)
	}
	if strings.TrimSpace(val) == "" {
		return fmt.Errorf("--set %s: empty value (write %s='' for an empty string)", s, key)
	}
	var v any
	if err := yaml.Unmarshal([]byte(val), &v); err != nil {
		return fmt.Errorf("--set %s: value %q is not valid YAML: %v", key, val, err)
	}
	path := strings.Split(key, ".")
	if err := setPath(raw, path, v); err != nil {
		return fmt.Errorf("--set %s: %w", key, err)
	}
	from[strings.Join(path, ".")] = "--set " + s
	return nil
}

// readYAML reads the file with viper and returns its settings as a tree of maps and lists. It
// refuses what is not a regular file (a FIFO would block, /dev/zero never ends) and files over
// MaxFileSize.
func readYAML(path string) (map[string]any, error) {
	b, err := files.Read(path, MaxFileSize)
	if err != nil {
		return nil, fmt.Errorf("config file %w", err)
	}
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(b)); err != nil {
		var pe viper.ConfigParseError
		if errors.As(err, &pe) {
			msg := strings.TrimPrefix(errors.Unwrap(pe).Error(), "yaml: ")
			msg = strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", "; ")), " ")
			return nil, fmt.Errorf("%s: malformed YAML: %s", path, msg)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	settings := normalizeTree(v.AllSettings()).(map[string]any)
	// viper leaves out keys with no value and lower-cases every key; the document itself has both.
	var doc any
	if err := yaml.Unmarshal(b, &doc); err == nil {
		doc = normalizeTree(doc)
		if nulls := nullKeys(doc, ""); len(nulls) > 0 {
			return nil, fmt.Errorf("%s: %s: no value (write '' for an empty string, or leave the key out for its default)",
				path, strings.Join(nulls, ", "))
		}
		keepDataKeys(settings, doc)
	}
	return settings, nil
}

// dataMaps are the maps whose keys are data, not config keys: they name something outside drmas and
// reach it as written (a chat template's kwargs such as dateString or a tool schema's property names,
// an MCP server's environment variables, the words a judge answers with). A "*" stands for every
// entry of a list.
var dataMaps = [][]string{
	{"agents", "*", "chat_template_kwargs"},
	{"tools", "mcp_servers", "*", "env"},
	{"reward", "judge", "verdicts"},
	{"orchestra", "runner", "env"},
}

// keepDataKeys puts back, from the YAML document as written, the values of the dataMaps, whose keys
// viper has lower-cased.
func keepDataKeys(settings map[string]any, doc any) {
	for _, path := range dataMaps {
		keepDataKey(settings, doc, path)
	}
}

// keepDataKey puts back, under settings, the value doc holds at path (keys matched without regard to
// case, as viper reads them).
func keepDataKey(settings, doc any, path []string) {
	if len(path) == 0 {
		return
	}
	if path[0] == "*" {
		got, _ := settings.([]any)
		written, _ := doc.([]any)
		for i := range min(len(got), len(written)) {
			if len(path) == 1 {
				got[i] = written[i]
			} else {
				keepDataKey(got[i], written[i], path[1:])
			}
		}
		return
	}
	m, ok := settings.(map[string]any)
	if !ok {
		return
	}
	w := lookupFold(doc, path[0])
	if w == nil {
		return
	}
	if len(path) == 1 {
		m[path[0]] = w
		return
	}
	keepDataKey(m[path[0]], w, path[1:])
}

// lookupFold returns node[key] for a map node, matching the key without regard to case (as viper
// reads config keys); nil when there is none.
func lookupFold(node any, key string) any {
	m, _ := node.(map[string]any)
	for k, v := range m {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return nil
}

// normalizeTree turns map[any]any (older YAML decoders) into map[string]any throughout.
func normalizeTree(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = normalizeTree(e)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[fmt.Sprint(k)] = normalizeTree(e)
		}
		return m
	case []any:
		for i, e := range t {
			t[i] = normalizeTree(e)
		}
	}
	return v
}

// setPath sets key (split on dots, list entries by index) in the tree, creating maps on the way.
func setPath(node map[string]any, key []string, v any) error {
	var cur any = node
	for i, k := range key {
		last := i == len(key)-1
		switch c := cur.(type) {
		case map[string]any:
			if last {
				c[k] = v
				return nil
			}
			next, ok := c[k]
			if !ok || next == nil {
				if _, err := strconv.Atoi(key[i+1]); err == nil {
					return fmt.Errorf("%s is not a list in the config", strings.Join(key[:i+1], "."))
				}
				next = map[string]any{}
				c[k] = next
			}
			cur = next
		case []any:
			idx, err := strconv.Atoi(k)
			if err != nil || idx < 0 || idx >= len(c) {
				return fmt.Errorf("%s: index %q out of range (the list has %d entries)", strings.Join(key[:i], "."), k, len(c))
			}
			if last {
				c[idx] = v
				return nil
			}
			cur = c[idx]
		default:
			return fmt.Errorf("%s is a value, not a section", strings.Join(key[:i], "."))
		}
	}
	return nil
}

// decode decodes the tree strictly over the defaults; list entries are decoded over their own defaults.
func decode(raw map[string]any) (*Config, error) {
	cfg := Defaults()
	models, _ := raw["models"].([]any)
	agents, _ := raw["agents"].([]any)
	rest := make(map[string]any, len(raw))
	for k, v := range raw {
		rest[k] = v
	}
	for _, k := range []string{"models", "agents"} {
		if v, ok := rest[k]; ok {
			if _, isList := v.([]any); !isList && v != nil {
				return nil, fmt.Errorf("%s: must be a list (- id: ...), got %s", k, describe(v))
			}
			delete(rest, k)
		}
	}
	if err := decodeInto(rest, &cfg, ""); err != nil {
		return nil, err
	}
	for i, m := range models {
		mc := model.Defaults()
		if err := decodeInto(m, &mc, fmt.Sprintf("models[%d]", i)); err != nil {
			return nil, err
		}
		if err := checkAdapterKeys(m, mc, fmt.Sprintf("models[%d]", i)); err != nil {
			return nil, err
		}
		cfg.Models = append(cfg.Models, mc)
	}
	for i, a := range agents {
		var ac team.Agent
		if err := decodeInto(a, &ac, fmt.Sprintf("agents[%d]", i)); err != nil {
			return nil, err
		}
		cfg.Agents = append(cfg.Agents, ac)
	}
	return &cfg, nil
}

func describe(v any) string {
	if v == nil {
		return "nothing"
	}
	return fmt.Sprintf("%T %v", v, v)
}

// checkAdapterKeys refuses, in a model entry as written, the keys an adapter (base: set) has no
// use for (it runs on its base's weights, tokenizer, dtype and device) and lora settings on an
// entry that is not an adapter: their defaults cannot tell "left out" from "written".
func checkAdapterKeys(raw any, mc model.Config, key string) error {
	m, _ := raw.(map[string]any)
	var errs []string
	if mc.IsAdapter() {
		for _, k := range []string{"path", "init", "tokenizer", "dtype", "device"} {
			if _, ok := m[k]; ok {
				errs = append(errs, fmt.Sprintf("%s.%s: an adapter (base: %s) has no %s of its own: it runs on its base's (set lora.path to start from a PEFT adapter folder)", key, k, mc.Base, k))
			}
		}
	} else if _, ok := m["lora"]; ok {
		errs = append(errs, fmt.Sprintf("%s.lora: only an adapter takes lora settings (set base: <model id> to make the entry one)", key))
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// loraTargetsHook lets `target_modules: all-linear` (a string, as PEFT writes it) stand for a list.
func loraTargetsHook(from, to reflect.Type, data any) (any, error) {
	if to == reflect.TypeOf(model.LoRA{}) {
		if m, ok := data.(map[string]any); ok {
			if s, ok := m["target_modules"].(string); ok {
				c := make(map[string]any, len(m))
				for k, v := range m {
					c[k] = v
				}
				c["target_modules"] = []any{s}
				return c, nil
			}
		}
	}
	return data, nil
}

// normalizationHook lets `normalization: drmas` stand for {preset: drmas}.
func normalizationHook(from, to reflect.Type, data any) (any, error) {
	if to == reflect.TypeOf(algo.Config{}.Normalization) && from.Kind() == reflect.String {
		return map[string]any{"preset": data}, nil
	}
	return data, nil
}

func decodeInto(input any, out any, prefix string) error {
	if input == nil {
		return nil
	}
	if _, ok := input.(map[string]any); !ok {
		name := prefix
		if name == "" {
			name = "config"
		}
		return fmt.Errorf("%s: must be a section (key: value), got %s", name, describe(input))
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		ErrorUnused: true,
		Result:      out,
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			strictHook, normalizationHook, loraTargetsHook),
	})
	if err != nil {
		return err
	}
	if err := dec.Decode(input); err != nil {
		return friendly(err, prefix)
	}
	return nil
}

var goTypeName = regexp.MustCompile(`^\w+\.[A-Z]\w*$`)

// friendly turns mapstructure's errors into one line per problem that names the key.
func friendly(err error, prefix string) error {
	var msgs []string
	var walk func(error, string)
	walk = func(e error, name string) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range j.Unwrap() {
				walk(c, name)
			}
			return
		}
		var de *mapstructure.DecodeError
		if errors.As(e, &de) {
			n := de.Name()
			if goTypeName.MatchString(n) {
				n = "" // the root of a decode is named by its Go type
			}
			walk(de.Unwrap(), n)
			return
		}
		key := name
		if prefix != "" {
			if key == "" {
				key = prefix
			} else {
				key = prefix + "." + key
			}
		}
		msg := e.Error()
		if rest, ok := strings.CutPrefix(msg, "has invalid keys: "); ok {
			for _, k := range strings.Split(rest, ", ") {
				full := k
				if key != "" {
					full = key + "." + k
				}
				msgs = append(msgs, fmt.Sprintf("unknown key %s", full))
			}
			return
		}
		msg = strings.NewReplacer("expected type", "want", "got unconvertible type", "got").Replace(msg)
		if key == "" {
			msgs = append(msgs, msg)
		} else {
			msgs = append(msgs, key+": "+msg)
		}
	}
	walk(err, "")
	sort.Strings(msgs)
	return errors.New(strings.Join(msgs, "; "))
}

// ReadResolved reads a resolved config as a run saved it (a checkpoint's config.yaml): strictly
// decoded, without environment or --set overrides and without validation.
func ReadResolved(path string) (*Config, error) {
	raw, err := readYAML(path)
	if err != nil {
		return nil, err
	}
	cfg, err := decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cfg.Source = path
	return cfg, nil
}
