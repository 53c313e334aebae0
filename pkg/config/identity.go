package config

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Identity flattens the resolved config (as --dry-run prints it) into key → value, with the keys
// --set takes (models.0.optim.lr) and the values as YAML writes them: what the ranks of a
// data-parallel group must hold alike.
func (cfg *Config) Identity() (map[string]string, error) {
	b, err := cfg.YAML()
	if err != nil {
		return nil, fmt.Errorf("resolved config: %w", err)
	}
	var tree any
	if err := yaml.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("resolved config: %w", err)
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(joinKey(prefix, k), e)
			}
		case []any:
			for i, e := range x {
				walk(joinKey(prefix, strconv.Itoa(i)), e)
			}
			if len(x) == 0 {
				out[prefix] = "[]"
			}
		default:
			out[prefix] = fmt.Sprint(x)
		}
	}
	walk("", tree)
	return out, nil
}

func joinKey(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}
