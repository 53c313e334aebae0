package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// Python's dict order in templates. transformers hands a template Python objects: tool schemas and
// tool-call arguments are dicts whose keys keep the order they were written in. A Go map has no
// order, so the JSON objects drmas decodes for a rendering (a kwarg given as json.RawMessage, a
// message, a tool call and its arguments) are Go maps whose key order is recorded, by map identity,
// for as long as the rendering runs; tojson (pyjson.go), the items filter and the items, keys and
// values methods follow it, as Python would. Maps the caller built (map[string]any kwargs) have no
// recorded order and come out sorted.

// keyOrders is the recorded key order of the maps of the renderings under way. A map's identity
// cannot be reused while its rendering holds it, and each rendering removes its own entries when
// it ends (a method has no access to the rendering's variables, hence one table for all).
var keyOrders = struct {
	sync.RWMutex
	m map[uintptr][]string
}{m: map[uintptr][]string{}}

// keyOrder is one rendering's share of keyOrders.
type keyOrder struct{ maps []uintptr }

// record sets the key order of m (every key of m, once).
func (o *keyOrder) record(m map[string]any, keys []string) {
	if len(keys) < 2 {
		return
	}
	p := reflect.ValueOf(m).Pointer()
	keyOrders.Lock()
	keyOrders.m[p] = keys
	keyOrders.Unlock()
	o.maps = append(o.maps, p)
}

// release forgets the orders the rendering recorded.
func (o *keyOrder) release() {
	keyOrders.Lock()
	for _, p := range o.maps {
		delete(keyOrders.m, p)
	}
	keyOrders.Unlock()
	o.maps = nil
}

// mapKeys returns the keys of the map m (string-keyed) in their recorded order, else sorted.
func mapKeys(m reflect.Value) []string {
	keyOrders.RLock()
	keys, ok := keyOrders.m[m.Pointer()]
	keyOrders.RUnlock()
	if ok && len(keys) == m.Len() {
		return keys
	}
	keys = make([]string, 0, m.Len())
	for _, k := range m.MapKeys() {
		keys = append(keys, k.String())
	}
	slices.Sort(keys)
	return keys
}

// decodeJSON decodes raw JSON into template values: objects into maps (their key order recorded
// in order), arrays into lists, integers into int (Python's json.loads keeps 1 and 1.0 apart),
// other numbers into float64.
func decodeJSON(raw []byte, order *keyOrder) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, order)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: more after the value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, order *keyOrder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]any{}
			var keys []string
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("invalid JSON: %w", err)
				}
				k := kt.(string)
				v, err := decodeValue(dec, order)
				if err != nil {
					return nil, err
				}
				if _, dup := m[k]; !dup {
					keys = append(keys, k)
				}
				m[k] = v // the last of duplicate keys wins, as in Python
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("invalid JSON: %w", err)
			}
			order.record(m, keys)
			return m, nil
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec, order)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("invalid JSON: %w", err)
			}
			return list, nil
		}
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil && i == int64(int(i)) {
			return int(i), nil
		}
		f, err := t.Float64()
		if err != nil {
			return nil, fmt.Errorf("invalid JSON: number %s: %w", t, err)
		}
		return f, nil
	}
	return tok, nil // string, bool or nil
}

// templateValues turns the json.RawMessage values in v (at any depth of maps and lists) into
// template values with decodeJSON.
func templateValues(v any, order *keyOrder) (any, error) {
	switch x := v.(type) {
	case json.RawMessage:
		return decodeJSON(x, order)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			d, err := templateValues(e, order)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out[k] = d
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			d, err := templateValues(e, order)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = d
		}
		return out, nil
	}
	return v, nil
}

// filterItems is jinja2's items filter: a mapping's (key, value) pairs in its order (the decoded
// JSON objects' recorded order, a template-built dict's own, else sorted), None giving none.
// gonja's gives none for a template-built dict and ignores key order.
func filterItems(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if len(params.Args)+len(params.KwArgs) > 0 {
		return exec.AsValue(errors.New("items takes no arguments"))
	}
	if in.IsNil() {
		return exec.AsValue([]any{})
	}
	v := reflect.ValueOf(in.Interface())
	d := asDict(in)
	switch {
	case d != nil:
		out := make([]any, len(d.Pairs))
		for i, p := range d.Pairs {
			out[i] = []any{p.Key.Interface(), p.Value.Interface()}
		}
		return exec.AsValue(out)
	case v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String:
		keys := mapKeys(v)
		out := make([]any, len(keys))
		for i, k := range keys {
			out[i] = []any{k, v.MapIndex(reflect.ValueOf(k).Convert(v.Type().Key())).Interface()}
		}
		return exec.AsValue(out)
	}
	return exec.AsValue(fmt.Errorf("items: %s is not a mapping", in.String()))
}

// dictMethods are Python's dict.items(), keys() and values() in the recorded key order. gonja
// hands a method a deep copy of the dict, whose identity (and so order) is lost: these read the
// original, selfValue, and return its own values.
var dictMethods = map[string]exec.Method[map[string]any]{
	"items": func(m map[string]any, self *exec.Value, a *exec.VarArgs) (any, error) {
		return dictView(m, self, a, "items")
	},
	"keys": func(m map[string]any, self *exec.Value, a *exec.VarArgs) (any, error) {
		return dictView(m, self, a, "keys")
	},
	"values": func(m map[string]any, self *exec.Value, a *exec.VarArgs) (any, error) {
		return dictView(m, self, a, "values")
	},
}

func dictView(copied map[string]any, self *exec.Value, a *exec.VarArgs, view string) (any, error) {
	if len(a.Args)+len(a.KwArgs) > 0 {
		return nil, fmt.Errorf("%s() takes no arguments", view)
	}
	var keys []string
	var get func(k string) any
	v := reflect.ValueOf(self.Interface())
	d := asDict(self)
	switch {
	case d != nil:
		vals := map[string]any{}
		for _, p := range d.Pairs {
			if p.Key.IsString() {
				keys = append(keys, p.Key.String())
				vals[p.Key.String()] = p.Value.Interface()
			}
		}
		get = func(k string) any { return vals[k] }
	case v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String:
		keys = mapKeys(v)
		get = func(k string) any { return v.MapIndex(reflect.ValueOf(k).Convert(v.Type().Key())).Interface() }
	default:
		keys = slices.Sorted(maps.Keys(copied))
		get = func(k string) any { return copied[k] }
	}
	out := make([]any, len(keys))
	for i, k := range keys {
		switch view {
		case "items":
			out[i] = []any{k, get(k)}
		case "keys":
			out[i] = k
		default:
			out[i] = get(k)
		}
	}
	return out, nil
}

// asDict is the ordered dict a value holds (a dict literal, kwargs given as JSON), or nil.
func asDict(v *exec.Value) *exec.Dict {
	switch x := v.Interface().(type) {
	case exec.Dict:
		return &x
	case *exec.Dict:
		return x
	}
	return nil
}
