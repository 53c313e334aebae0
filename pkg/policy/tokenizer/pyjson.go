package tokenizer

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// JSON out of templates, as Python has it: transformers' tojson filter is
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False), and it follows
// the key order of the dicts it is given (keyorder.go).

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
