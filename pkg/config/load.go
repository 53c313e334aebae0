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

// keepDataKeys puts back, from the YAML document as written, the values whose keys are data rather
// than config keys: agents[].chat_template_kwargs, whose keys (dateString, a tool schema's property
// names) must reach the chat template exactly as written, where viper has lower-cased them.
func keepDataKeys(settings map[string]any, doc any) {
	agents, _ := settings["agents"].([]any)
	written, _ := lookupFold(doc, "agents").([]any)
	for i := range min(len(agents), len(written)) {
		a, ok := agents[i].(map[string]any)
		if !ok {
			continue
		}
		if kw := lookupFold(written[i], "chat_template_kwargs"); kw != nil {
			a["chat_template_kwargs"] = kw
		}
	}
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

// applyEnv applies DRMAS_SECTION_KEY=value overrides for every known scalar key, list entries by
// index (DRMAS_MODELS_0_OPTIM_LR). A DRMAS_ variable that starts like a section but names no key is
// an error (a typo would otherwise be ignored); other DRMAS_ variables are not config keys.
func applyEnv(raw map[string]any, environ []string, from origins) error {
	byEnv := envNames(reflect.TypeOf(Config{}), "")
	lists := map[string]map[string]string{
		"MODELS": envNames(reflect.TypeOf(model.Config{}), ""),
		"AGENTS": envNames(reflect.TypeOf(team.Agent{}), ""),
	}
	sections := sectionNames()
	sort.Strings(environ)
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(name, EnvPrefix)
		if !ok {
			continue
		}
		key, ok := byEnv[rest]
		if m := envListRE.FindStringSubmatch(rest); m != nil {
			if k, found := lists[m[1]][m[3]]; found {
				key, ok = strings.ToLower(m[1])+"."+m[2]+"."+k, true
			}
		}
		if !ok {
			section, _, _ := strings.Cut(rest, "_")
			if sections[section] {
				return fmt.Errorf("%s: no config key has this name (DRMAS_ + the key's path in capitals, dots as underscores, list entries by index: DRMAS_MODELS_0_OPTIM_LR)", name)
			}
			continue // other DRMAS_ variables (e.g. DRMAS_LOG) are not config keys
		}
		if strings.TrimSpace(val) == "" {
			return fmt.Errorf("%s: empty value (unset the variable to keep the file's value)", name)
		}
		var v any
		if err := yaml.Unmarshal([]byte(val), &v); err != nil {
			return fmt.Errorf("%s: value %q is not valid YAML: %v", name, val, err)
		}
		if err := setPath(raw, strings.Split(key, "."), v); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		from[key] = "environment " + name + "=" + val
	}
	return nil
}

var envListRE = regexp.MustCompile(`^(MODELS|AGENTS)_(\d+)_(.+)$`)

// envNames maps the environment spelling of every scalar key of a config type to its dotted key.
func envNames(t reflect.Type, prefix string) map[string]string {
	keys := leafKeys(t, prefix)
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		out[strings.ToUpper(strings.ReplaceAll(k, ".", "_"))] = k
	}
	return out
}

// sectionNames are the top-level keys in environment spelling (RUN, MODELS, ...): Config's fields,
// and those of the sections squashed into it (team's).
func sectionNames() map[string]bool {
	out := map[string]bool{}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			tag := strings.Split(t.Field(i).Tag.Get("mapstructure"), ",")
			switch {
			case len(tag) > 1 && tag[1] == "squash":
				add(t.Field(i).Type)
			case tag[0] != "-" && tag[0] != "":
				out[strings.ToUpper(tag[0])] = true
			}
		}
	}
	add(reflect.TypeOf(Config{}))
	return out
}

// leafKeys lists the dotted keys of the non-list fields of a config struct type.
func leafKeys(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("mapstructure"), ",")
		name := tag[0]
		if name == "-" || !f.IsExported() {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if len(tag) > 1 && tag[1] == "squash" {
			out = append(out, leafKeys(ft, prefix)...)
			continue
		}
		key := prefix + name
		switch {
		case ft.Kind() == reflect.Struct && ft.String() != "time.Duration":
			out = append(out, leafKeys(ft, key+".")...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			// lists of sections are set with --set models.0.key=value
		default:
			out = append(out, key)
		}
	}
	return out
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

// YAML renders the resolved config as YAML (what --dry-run prints and checkpoints store).
func (c *Config) YAML() ([]byte, error) {
	plain := toPlain(reflect.ValueOf(*c))
	// A model entry's keys as an entry of its kind takes them (checkAdapterKeys): an adapter without
	// the base's settings it has none of, a full model without lora settings.
	if top, ok := plain.(map[string]any); ok {
		models, _ := top["models"].([]any)
		for _, m := range models {
			if e, ok := m.(map[string]any); ok {
				if e["base"] == "" {
					delete(e, "base")
					delete(e, "lora")
				} else {
					for _, k := range []string{"path", "init", "tokenizer", "dtype", "device"} {
						delete(e, k)
					}
				}
			}
		}
	}
	return yaml.Marshal(plain)
}

// toPlain converts a config value into maps keyed by mapstructure names, with durations as strings
// and nil pointers left out, so the YAML reads like the input.
func toPlain(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return toPlain(v.Elem())
	case reflect.Struct:
		if d, ok := v.Interface().(interface{ String() string }); ok && v.Type().String() == "time.Duration" {
			return d.String()
		}
		m := map[string]any{}
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			tag := strings.Split(f.Tag.Get("mapstructure"), ",")
			if tag[0] == "-" || !f.IsExported() {
				continue
			}
			val := toPlain(v.Field(i))
			if len(tag) > 1 && tag[1] == "squash" {
				for k, e := range val.(map[string]any) {
					m[k] = e
				}
				continue
			}
			if val == nil {
				continue
			}
			m[tag[0]] = val
		}
		return m
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = toPlain(v.Index(i))
		}
		return out
	case reflect.Int64:
		if v.Type().String() == "time.Duration" {
			return v.Interface().(fmt.Stringer).String()
		}
	}
	return v.Interface()
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
