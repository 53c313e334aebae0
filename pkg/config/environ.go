package config

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/team"
	"gopkg.in/yaml.v3"
)

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
