package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// JSON in and out of templates, as Python has it.
//
// transformers hands a template Python objects: tool schemas and tool-call arguments are dicts
// whose keys keep the order they were written in, and its tojson filter is
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False). A Go map has no
// order, so the JSON objects drmas decodes for a rendering (a kwarg given as json.RawMessage, a
// message, a tool call and its arguments) are Go maps whose key order is recorded, by map
// identity, for as long as the rendering runs; tojson, the items filter and the items, keys and
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

// jsonOptions are json.dumps' formatting arguments.
type jsonOptions struct {
	ensureASCII bool
	indent      string // "" with hasIndent: newlines without indentation
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
}

// filterToJSON is transformers' tojson filter:
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False), the objects
// decoded for the rendering in their key order.
func filterToJSON(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	opts, err := toJSONOptions(params)
	if err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	var sb strings.Builder
	w := &pyJSONWriter{sb: &sb, opts: opts}
	if err := w.write(reflect.ValueOf(in.Interface()), 0); err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	return exec.AsSafeValue(sb.String())
}

// toJSONOptions reads tojson's arguments: ensure_ascii, indent, separators and sort_keys, by
// position or keyword.
func toJSONOptions(params *exec.VarArgs) (jsonOptions, error) {
	opts := jsonOptions{itemSep: ", ", keySep: ": "}
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	if len(params.Args) > len(names) {
		return opts, fmt.Errorf("takes at most %d arguments, got %d", len(names), len(params.Args))
	}
	args := map[string]*exec.Value{}
	for i, a := range params.Args {
		args[names[i]] = a
	}
	for k, v := range params.KwArgs {
		if !slices.Contains(names, k) {
			return opts, fmt.Errorf("unexpected keyword argument %q", k)
		}
		if _, dup := args[k]; dup {
			return opts, fmt.Errorf("got multiple values for argument %q", k)
		}
		args[k] = v
	}
	if v := args["ensure_ascii"]; v != nil && !v.IsNil() {
		opts.ensureASCII = v.IsTrue()
	}
	if v := args["indent"]; v != nil && !v.IsNil() {
		opts.hasIndent = true
		switch {
		case v.IsInteger() && !v.IsBool():
			opts.indent = strings.Repeat(" ", max(v.Integer(), 0))
		case v.IsString():
			opts.indent = v.String()
		default:
			return opts, fmt.Errorf("indent must be an integer or a string, got %s", v.String())
		}
		opts.itemSep = ","
	}
	if v := args["separators"]; v != nil && !v.IsNil() {
		if !v.IsList() || v.Len() != 2 || !v.Index(0).IsString() || !v.Index(1).IsString() {
			return opts, fmt.Errorf("separators must be two strings, got %s", v.String())
		}
		opts.itemSep, opts.keySep = v.Index(0).String(), v.Index(1).String()
	}
	if v := args["sort_keys"]; v != nil && !v.IsNil() {
		opts.sortKeys = v.IsTrue()
	}
	return opts, nil
}

// pyJSONWriter writes template values as Python's json.dumps does.
type pyJSONWriter struct {
	sb    *strings.Builder
	opts  jsonOptions
	level int // nesting of the value being written, for indentation
}

// maxJSONDepth bounds the nesting tojson follows (Python's recursion limit would stop it too).
const maxJSONDepth = 200

var (
	typeValuePtr = reflect.TypeFor[*exec.Value]()
	typeDictPtr  = reflect.TypeFor[*exec.Dict]()
)

func (w *pyJSONWriter) write(v reflect.Value, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("nested deeper than %d levels", maxJSONDepth)
	}
	for v.IsValid() && v.Kind() == reflect.Interface {
		if v.IsNil() {
			w.sb.WriteString("null")
			return nil
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		w.sb.WriteString("null")
		return nil
	}
	switch v.Type() {
	case typeValuePtr:
		if v.IsNil() {
			w.sb.WriteString("null")
			return nil
		}
		return w.write(reflect.ValueOf(v.Interface().(*exec.Value).Interface()), depth)
	case typeDictPtr:
		if v.IsNil() {
			w.sb.WriteString("null")
			return nil
		}
		return w.dict(*v.Interface().(*exec.Dict), depth)
	case exec.TypeDict:
		return w.dict(v.Interface().(exec.Dict), depth)
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			w.sb.WriteString("null")
			return nil
		}
		return w.write(v.Elem(), depth)
	case reflect.Bool:
		if v.Bool() {
			w.sb.WriteString("true")
		} else {
			w.sb.WriteString("false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		w.sb.WriteString(strconv.FormatInt(v.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		w.sb.WriteString(strconv.FormatUint(v.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		w.sb.WriteString(pyFloat(v.Float()))
	case reflect.String:
		w.str(v.String())
	case reflect.Slice, reflect.Array:
		n := v.Len()
		items := make([]reflect.Value, n)
		for i := range n {
			items[i] = v.Index(i)
		}
		return w.seq('[', ']', n, func(i int) error { return w.write(items[i], depth+1) })
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return fmt.Errorf("keys must be str, int, float, bool or None, not %s", v.Type().Key())
		}
		keys := mapKeys(v)
		if w.opts.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		return w.seq('{', '}', len(keys), func(i int) error {
			w.str(keys[i])
			w.sb.WriteString(w.opts.keySep)
			return w.write(v.MapIndex(reflect.ValueOf(keys[i]).Convert(v.Type().Key())), depth+1)
		})
	default:
		return fmt.Errorf("object of type %s is not JSON serializable", v.Type())
	}
	return nil
}

// dict writes a dict the template built ({"k": v}), in its order.
func (w *pyJSONWriter) dict(d exec.Dict, depth int) error {
	type entry struct {
		key string
		val *exec.Value
	}
	entries := make([]entry, 0, len(d.Pairs))
	for _, p := range d.Pairs {
		var key string
		switch k := p.Key; {
		case k.IsString():
			key = k.String()
		case k.IsNil():
			key = "null"
		case k.IsBool():
			key = strconv.FormatBool(k.Bool())
		case k.IsInteger():
			key = strconv.Itoa(k.Integer())
		case k.IsFloat():
			key = pyFloat(k.Float())
		default:
			return fmt.Errorf("keys must be str, int, float, bool or None, not %s", k.String())
		}
		entries = append(entries, entry{key, p.Value})
	}
	if w.opts.sortKeys {
		slices.SortStableFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	}
	return w.seq('{', '}', len(entries), func(i int) error {
		w.str(entries[i].key)
		w.sb.WriteString(w.opts.keySep)
		return w.write(reflect.ValueOf(entries[i].val), depth+1)
	})
}

// seq writes n items between open and close, with json.dumps' separators and indentation.
func (w *pyJSONWriter) seq(open, close byte, n int, item func(i int) error) error {
	w.sb.WriteByte(open)
	if n == 0 {
		w.sb.WriteByte(close)
		return nil
	}
	indent := func(level int) {
		if w.opts.hasIndent {
			w.sb.WriteByte('\n')
			for range level {
				w.sb.WriteString(w.opts.indent)
			}
		}
	}
	level := w.level + 1
	w.level = level
	for i := range n {
		if i > 0 {
			w.sb.WriteString(w.opts.itemSep)
		}
		indent(level)
		if err := item(i); err != nil {
			return err
		}
	}
	w.level = level - 1
	indent(w.level)
	w.sb.WriteByte(close)
	return nil
}

// str writes s as a JSON string the way json.dumps does: \" \\ \n \r \t \b \f, other control
// characters as \u00XX, and with ensure_ascii every non-ASCII character as \uXXXX (UTF-16).
func (w *pyJSONWriter) str(s string) {
	w.sb.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch r {
		case '"':
			w.sb.WriteString(`\"`)
		case '\\':
			w.sb.WriteString(`\\`)
		case '\n':
			w.sb.WriteString(`\n`)
		case '\r':
			w.sb.WriteString(`\r`)
		case '\t':
			w.sb.WriteString(`\t`)
		case '\b':
			w.sb.WriteString(`\b`)
		case '\f':
			w.sb.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(w.sb, `\u%04x`, r)
			case w.opts.ensureASCII && r > 0x7e && r < 0x10000:
				fmt.Fprintf(w.sb, `\u%04x`, r)
			case w.opts.ensureASCII && r >= 0x10000:
				r -= 0x10000
				fmt.Fprintf(w.sb, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				w.sb.WriteRune(r) // an invalid byte becomes U+FFFD
			}
		}
	}
	w.sb.WriteByte('"')
}

// pyFloat is Python's repr of a float (what json.dumps writes): the shortest digits that read
// back, positional for exponents from -4 to 15 (always with a fractional part), else
// scientific with a signed exponent of at least two digits; NaN and Infinity as json.dumps writes
// them.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expText, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expText)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
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
