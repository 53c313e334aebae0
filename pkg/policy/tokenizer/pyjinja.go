package tokenizer

import (
	"reflect"
	"strconv"
	"strings"
	"unsafe"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Python's subscripts in gonja templates.
//
// gonja (v2.9.1) indexes strings by byte, returns nothing for a negative
// index equal to minus the length (["a"][-1], "a"[-1], messages[-1] on a
// one-message list) and slices with out-of-range bounds wrongly. Chat
// templates lean on exactly these: Qwen3 takes
// content.split('<think>')[-1], Mistral tool_call.id[-9:]. Rather than fork
// the library, a parsed template has every subscript x[i] and slice
// x[a:b:c] replaced by a call of a global function that does what Python's
// jinja2 does (getitem/getslice below).

// Names of the globals that rewritten subscripts call. They cannot clash
// with a template's own names: jinja2 sandboxes reject names with "__".
const (
	getitemName  = "__drmas_getitem__"
	getsliceName = "__drmas_getslice__"
)

// pythonize rewrites every GetItem and GetSlice node under root into calls
// of getitemName / getsliceName (and, for the sandbox, the operators + * ~
// and loop() calls: sandboxCall), and re-reads every string literal from
// source with Python's escapes (gonja unescapes twice, so '\\n' becomes a
// newline, and keeps a backslash-newline that Python drops). Some of gonja's control-structure nodes
// keep their expressions in unexported fields ({% set %}'s right-hand side),
// so the walk writes them through unsafe pointers; the nodes are freshly
// parsed and owned by this template.
func pythonize(root *nodes.Template, source string) {
	w := &rewriter{source: source, done: map[any]nodes.Expression{}, seen: map[uintptr]bool{}}
	w.walk(reflect.ValueOf(root))
}

type rewriter struct {
	source string                   // the template's text
	done   map[any]nodes.Expression // replaced node → its call, for nodes reachable twice
	seen   map[uintptr]bool         // struct pointers already walked
}

var (
	nodeType = reflect.TypeFor[nodes.Node]()
	exprType = reflect.TypeFor[nodes.Expression]()
)

// walk visits v and everything reachable from it, replacing subscripts in
// place wherever they sit in a field, slice element or map value whose
// type can hold the replacement.
func (w *rewriter) walk(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() || v.Elem().Kind() != reflect.Struct || w.seen[v.Pointer()] {
			return
		}
		w.seen[v.Pointer()] = true
		if str, ok := v.Interface().(*nodes.String); ok {
			w.literal(str)
			return
		}
		w.walk(v.Elem())
	case reflect.Interface:
		if !v.IsNil() {
			w.walk(v.Elem())
		}
	case reflect.Struct:
		if v.Type().PkgPath() == "github.com/nikolalohinski/gonja/v2/tokens" {
			return
		}
		for i := range v.NumField() {
			f := v.Field(i)
			if !f.CanSet() {
				if !f.CanAddr() {
					continue
				}
				f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
			}
			w.slot(f)
		}
	case reflect.Slice:
		for i := range v.Len() {
			w.slot(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			val := reflect.New(v.Type().Elem()).Elem()
			val.Set(v.MapIndex(k))
			w.slot(val)
			v.SetMapIndex(k, val)
		}
	}
}

// slot walks a settable value and replaces it when it holds a subscript.
func (w *rewriter) slot(v reflect.Value) {
	if v.Kind() == reflect.Interface && !v.IsNil() && (v.Type() == nodeType || v.Type() == exprType) {
		if call := w.replacement(v.Elem().Interface()); call != nil {
			v.Set(reflect.ValueOf(call))
			return
		}
	}
	w.walk(v)
}

// replacement returns the call that replaces n, or nil when n is no
// subscript.
func (w *rewriter) replacement(n any) nodes.Expression {
	if call, ok := w.done[n]; ok {
		return call
	}
	var call *nodes.Call
	switch s := n.(type) {
	case *nodes.GetItem:
		if s.Arg == nil {
			return nil
		}
		w.walk(reflect.ValueOf(s))
		call = globalCall(s.Location, getitemName, s.Node, s.Arg)
	case *nodes.GetSlice:
		w.walk(reflect.ValueOf(s))
		call = globalCall(s.Location, getsliceName, s.Node, orNone(s.Start, s.Location), orNone(s.End, s.Location), orNone(s.Step, s.Location))
	default:
		if call = w.sandboxCall(n); call == nil {
			return nil
		}
	}
	w.done[n] = call
	return call
}

// globalCall is the node of a call of the global function name.
func globalCall(at *tokens.Token, name string, args ...nodes.Node) *nodes.Call {
	exprs := make([]nodes.Expression, len(args))
	for i, a := range args {
		exprs[i] = a
	}
	tok := *at
	tok.Val = name
	return &nodes.Call{Location: at, Func: &nodes.Name{Name: &tok}, Args: exprs, Kwargs: map[string]nodes.Expression{}}
}

func orNone(n nodes.Node, at *tokens.Token) nodes.Node {
	if n == nil {
		return &nodes.None{Location: at}
	}
	return n
}

// getitem is jinja2's Environment.getitem: obj[key] with Python's indexing
// of lists and strings (negative indices count from the end, strings by code
// point), else the attribute of that name, else undefined (None here).
func getitem(e *exec.Evaluator, args *exec.VarArgs) *exec.Value {
	obj, key := args.Args[0], args.Args[1]
	if key.IsInteger() && !key.IsBool() {
		i := key.Integer()
		switch {
		case obj.IsString():
			r := []rune(obj.String())
			if i < 0 {
				i += len(r)
			}
			if i < 0 || i >= len(r) {
				return exec.AsValue(nil)
			}
			return exec.AsValue(string(r[i]))
		case obj.IsList():
			n := obj.Len()
			if i < 0 {
				i += n
			}
			if i < 0 || i >= n {
				return exec.AsValue(nil)
			}
			return obj.Index(i)
		}
	}
	if obj.IsNil() {
		return exec.AsValue(nil)
	}
	var k any
	switch {
	case key.IsString():
		k = key.String()
	case key.IsInteger():
		k = key.Integer()
	default:
		return exec.AsValue(nil)
	}
	item, found := obj.GetItem(k)
	if !found && key.IsString() {
		item, found = obj.GetAttribute(key.String())
	}
	if !found {
		return exec.AsValue(nil)
	}
	return item
}

// getslice is Python's obj[start:stop:step] on a string (by code point) or
// a list; None bounds are omitted ones.
func getslice(e *exec.Evaluator, args *exec.VarArgs) *exec.Value {
	obj := args.Args[0]
	bound := func(v *exec.Value) (int, bool, *exec.Value) {
		if v.IsNil() {
			return 0, false, nil
		}
		if !v.IsInteger() {
			return 0, false, exec.AsValue(errorf("slice indices must be integers or None, got %s", v.String()))
		}
		return v.Integer(), true, nil
	}
	start, hasStart, err := bound(args.Args[1])
	if err != nil {
		return err
	}
	stop, hasStop, err := bound(args.Args[2])
	if err != nil {
		return err
	}
	step, hasStep, err := bound(args.Args[3])
	if err != nil {
		return err
	}
	if !hasStep {
		step = 1
	}
	if step == 0 {
		return exec.AsValue(errorf("slice step cannot be zero"))
	}
	switch {
	case obj.IsString():
		r := []rune(obj.String())
		idx := sliceIndices(len(r), start, stop, step, hasStart, hasStop)
		out := make([]rune, len(idx))
		for j, i := range idx {
			out[j] = r[i]
		}
		return exec.AsValue(string(out))
	case obj.IsList():
		idx := sliceIndices(obj.Len(), start, stop, step, hasStart, hasStop)
		out := make([]any, len(idx))
		for j, i := range idx {
			out[j] = obj.Index(i).Interface()
		}
		return exec.AsValue(out)
	case obj.IsNil():
		return exec.AsValue(nil)
	}
	return exec.AsValue(errorf("cannot slice %s", obj.String()))
}

// sliceIndices lists the indices that Python's slice(start, stop,
// step).indices(n) selects.
func sliceIndices(n, start, stop, step int, hasStart, hasStop bool) []int {
	clamp := func(i, lo, hi int) int { return min(max(i, lo), hi) }
	var lo, hi int
	if step > 0 {
		lo, hi = 0, n
	} else {
		lo, hi = -1, n-1
	}
	norm := func(i int, has bool, dflt int) int {
		if !has {
			return dflt
		}
		if i < 0 {
			i += n
		}
		return clamp(i, lo, hi)
	}
	var from, to int
	if step > 0 {
		from, to = norm(start, hasStart, 0), norm(stop, hasStop, n)
	} else {
		from, to = norm(start, hasStart, n-1), norm(stop, hasStop, -1)
	}
	var out []int
	for i := from; (step > 0 && i < to) || (step < 0 && i > to); i += step {
		out = append(out, i)
	}
	return out
}

// literal sets a string node's value from its text in the source, decoded
// as Python decodes a jinja2 string literal. Nodes that gonja made up
// (no quote at their position) are left alone.
func (w *rewriter) literal(s *nodes.String) {
	if s.Location == nil || s.Location.Pos >= len(w.source) {
		return
	}
	src := w.source[s.Location.Pos:]
	quote := src[0]
	if quote != '"' && quote != '\'' {
		return
	}
	for i := 1; i < len(src); i++ {
		switch src[i] {
		case '\\':
			i++
		case quote:
			s.Val = pythonUnescape(src[1:i])
			return
		}
	}
}

// pythonUnescape decodes the backslash escapes of a Python string literal:
// \\ \' \" \a \b \f \n \r \t \v, \ooo, \xhh, \uhhhh, \Uhhhhhhhh,
// and a backslash-newline, which vanishes. Unknown escapes stay as written.
func pythonUnescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	simple := map[byte]string{'\\': "\\", '\'': "'", '"': "\"", 'a': "\a", 'b': "\b", 'f': "\f",
		'n': "\n", 'r': "\r", 't': "\t", 'v': "\v", '\n': ""}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			sb.WriteByte(s[i])
			continue
		}
		c := s[i+1]
		if r, ok := simple[c]; ok {
			sb.WriteString(r)
			i++
			continue
		}
		digits, base := 0, 16
		switch c {
		case 'x':
			digits = 2
		case 'u':
			digits = 4
		case 'U':
			digits = 8
		default:
			if c >= '0' && c <= '7' {
				digits, base = 1, 8
				for digits < 3 && i+1+digits < len(s) && s[i+1+digits] >= '0' && s[i+1+digits] <= '7' {
					digits++
				}
				if n, err := strconv.ParseUint(s[i+1:i+1+digits], 8, 32); err == nil {
					sb.WriteRune(rune(n))
					i += digits
					continue
				}
			}
		}
		if base == 16 && digits > 0 && i+2+digits <= len(s) {
			if n, err := strconv.ParseUint(s[i+2:i+2+digits], 16, 32); err == nil {
				sb.WriteRune(rune(n))
				i += 1 + digits
				continue
			}
		}
		sb.WriteByte('\\')
	}
	return sb.String()
}
