package config

import (
	"fmt"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

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
