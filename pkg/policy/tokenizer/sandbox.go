package tokenizer

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
)

// The sandbox a chat template renders in. transformers renders chat templates in jinja2's
// ImmutableSandboxedEnvironment, which refuses ranges over 100,000 items; a template is data from a
// model folder, so drmas bounds every way one can exhaust the machine: the length of a range, the
// size of what string and list operators build and of the output, the depth of nested macro calls
// and recursive loops (counted before Go's stack overflows, which would be fatal), and the time.
// Each bound is an error naming it ("template: range of 1000000000 items exceeds 100000"). Templates
// cannot include, import or extend other templates (transformers gives them no loader either).
const (
	maxTemplateRange  = 100_000          // jinja2's sandbox MAX_RANGE
	maxTemplateBytes  = 64 << 20         // a string built, or the output: a dataset line's bound (pkg/files)
	maxTemplateItems  = maxTemplateRange // a list built with + or *
	maxTemplateDepth  = 200              // nested macro calls and loop() recursions
	sandboxName       = "__drmas_sandbox__"
	addName, mulName  = "__drmas_add__", "__drmas_mul__"
	catName, loopName = "__drmas_cat__", "__drmas_loop__"
)

// maxTemplateTime bounds one rendering (a variable for the tests).
var maxTemplateTime = 10 * time.Second

// sandboxError is a bound a rendering ran into. It travels as a panic from wherever the bound is
// checked (inside gonja's evaluation, which may drop error values) to render, which returns it.
type sandboxError struct{ msg string }

func (e sandboxError) Error() string { return "template: " + e.msg }

// sandbox is the state of one rendering.
type sandbox struct {
	deadline time.Time
	limit    time.Duration
	depth    int
}

func newSandbox(limit time.Duration) *sandbox {
	return &sandbox{deadline: time.Now().Add(limit), limit: limit}
}

func (s *sandbox) fail(format string, args ...any) {
	panic(sandboxError{fmt.Sprintf(format, args...)})
}

// tick fails once the rendering has run out of time; every hook calls it.
func (s *sandbox) tick() {
	if time.Now().After(s.deadline) {
		s.fail("rendering took longer than %s", s.limit)
	}
}

// enter counts one more nested call; leave undoes it.
func (s *sandbox) enter(what string) {
	s.tick()
	if s.depth++; s.depth > maxTemplateDepth {
		s.fail("%s nested deeper than %d calls (recursion)", what, maxTemplateDepth)
	}
}

func (s *sandbox) leave() { s.depth-- }

// sandboxOf finds the rendering's sandbox in the template's variables. A template that overwrote the
// name gets a fresh one (with its own clock), never none.
func sandboxOf(ctx *exec.Context) *sandbox {
	if v, ok := ctx.Get(sandboxName); ok {
		if s, ok := v.(*sandbox); ok {
			return s
		}
	}
	return newSandbox(maxTemplateTime)
}

// checkBytes fails when a string of n bytes would exceed the bound.
func (s *sandbox) checkBytes(n float64) {
	if n > maxTemplateBytes {
		s.fail("a string of %.0f bytes exceeds %d", n, maxTemplateBytes)
	}
}

// sandboxWriter is the output of a rendering, bounded in size.
type sandboxWriter struct {
	s *sandbox
	b strings.Builder
}

func (w *sandboxWriter) Write(p []byte) (int, error) {
	w.check(len(p))
	return w.b.Write(p)
}

func (w *sandboxWriter) WriteString(p string) (int, error) {
	w.check(len(p))
	return w.b.WriteString(p)
}

func (w *sandboxWriter) check(n int) {
	w.s.tick()
	if w.b.Len()+n > maxTemplateBytes {
		w.s.fail("output of more than %d bytes", maxTemplateBytes)
	}
}

// sandboxGlobals are the template globals of the sandbox: a bounded range and the functions that
// the rewritten operators and loop() calls call (see pythonize).
func sandboxGlobals(ctx *exec.Context) {
	ctx.Set("range", sandboxRange)
	ctx.Set(addName, sandboxAdd)
	ctx.Set(mulName, sandboxMul)
	ctx.Set(catName, sandboxCat)
	ctx.Set(loopName, sandboxLoop)
}

// sandboxRange is Python's range(start, stop, step) as a list, refused past maxTemplateRange items.
func sandboxRange(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	s := sandboxOf(e.Environment.Context)
	s.tick()
	start, stop, step := 0, 0, 1
	ints := len(params.Args) > 0
	for _, a := range params.Args {
		ints = ints && a.IsInteger()
	}
	switch n := len(params.Args); {
	case ints && n == 1:
		stop = params.Args[0].Integer()
	case ints && n == 2:
		start, stop = params.Args[0].Integer(), params.Args[1].Integer()
	case ints && n == 3:
		start, stop, step = params.Args[0].Integer(), params.Args[1].Integer(), params.Args[2].Integer()
	default:
		return exec.AsValue(errorf("range: expected signature is [start, ]stop[, step] where all arguments are integers"))
	}
	if step == 0 {
		return exec.AsValue(errorf("range: step cannot be 0"))
	}
	// The length as Python computes it, in floating point first so that no bound overflows.
	span := (float64(stop) - float64(start)) / float64(step)
	if span > maxTemplateRange+1 {
		s.fail("range of %.0f items exceeds %d", math.Ceil(span), maxTemplateRange)
	}
	var out []int
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		out = append(out, i)
	}
	if len(out) > maxTemplateRange {
		s.fail("range of %d items exceeds %d", len(out), maxTemplateRange)
	}
	if out == nil {
		out = []int{}
	}
	return exec.AsValue(out)
}

// sandboxCat is a ~ b.
func sandboxCat(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	s := sandboxOf(e.Environment.Context)
	s.tick()
	a, b := params.Args[0].String(), params.Args[1].String()
	s.checkBytes(float64(len(a)) + float64(len(b)))
	return exec.AsValue(a + b)
}

// sandboxAdd is a + b with gonja's meaning (lists concatenate, a float makes a float, a string
// makes a concatenation, else integers add), bounded in size.
func sandboxAdd(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	s := sandboxOf(e.Environment.Context)
	s.tick()
	a, b := params.Args[0], params.Args[1]
	switch {
	case a.IsList():
		if !b.IsList() {
			return exec.AsValue(errorf("unable to concatenate list to %s", b.String()))
		}
		if n := a.Len() + b.Len(); n > maxTemplateItems {
			s.fail("a list of %d items exceeds %d", n, maxTemplateItems)
		}
		out := make([]any, 0, a.Len()+b.Len())
		for _, v := range []*exec.Value{a, b} {
			for i := range v.Len() {
				out = append(out, v.Index(i).Interface())
			}
		}
		return exec.AsValue(out)
	case a.IsString() != b.IsString() && !a.IsNil() && !b.IsNil():
		// Python adds a string only to a string (None stays gonja's empty string: gonja cannot
		// tell it from undefined).
		if a.IsString() {
			return exec.AsValue(errorf("can only concatenate str (not %q) to str", pyTypeName(b)))
		}
		return exec.AsValue(errorf("unsupported operand type(s) for +: '%s' and 'str'", pyTypeName(a)))
	case a.IsFloat() || b.IsFloat():
		return exec.AsValue(a.Float() + b.Float())
	case a.IsString() || b.IsString():
		x, y := a.String(), b.String()
		s.checkBytes(float64(len(x)) + float64(len(y)))
		return exec.AsValue(x + y)
	}
	return exec.AsValue(a.Integer() + b.Integer())
}

// pyTypeName is the name of v's Python type.
func pyTypeName(v *exec.Value) string {
	switch {
	case v.IsNil():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsString():
		return "str"
	case v.IsInteger():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return reflect.TypeOf(v.Interface()).String()
}

// sandboxMul is a * b with Python's meaning for a string or a list times an integer (either way
// round), else gonja's (a float makes a float, else integers multiply), bounded in size.
func sandboxMul(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	s := sandboxOf(e.Environment.Context)
	s.tick()
	a, b := params.Args[0], params.Args[1]
	if (b.IsString() || b.IsList()) && a.IsInteger() && !a.IsString() {
		a, b = b, a
	}
	switch {
	case a.IsFloat() || b.IsFloat():
		return exec.AsValue(a.Float() * b.Float())
	case a.IsString():
		x, n := a.String(), max(b.Integer(), 0)
		s.checkBytes(float64(len(x)) * float64(n))
		return exec.AsValue(strings.Repeat(x, n))
	case a.IsList() && b.IsInteger():
		n := max(b.Integer(), 0)
		if items := float64(a.Len()) * float64(n); items > maxTemplateItems {
			s.fail("a list of %.0f items exceeds %d", items, maxTemplateItems)
		}
		out := make([]any, 0, a.Len()*n)
		for range n {
			for i := range a.Len() {
				out = append(out, a.Index(i).Interface())
			}
		}
		return exec.AsValue(out)
	}
	return exec.AsValue(a.Integer() * b.Integer())
}

// sandboxLoop is loop(items) inside a recursive for loop, counted as one nesting level.
func sandboxLoop(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	s := sandboxOf(e.Environment.Context)
	fn, ok := params.Args[0].Interface().(func(*exec.VarArgs) *exec.Value)
	if !ok {
		return exec.AsValue(errorf("loop is not callable here: only inside a recursive for loop"))
	}
	s.enter("loop()")
	defer s.leave()
	return fn(&exec.VarArgs{Args: params.Args[1:], KwArgs: params.KwArgs})
}

// sandboxControlStructures are gonja's control structures less include, import, from and extends,
// with macros that count their nesting and for loops that look at the clock.
func sandboxControlStructures() *exec.ControlStructureSet {
	all := map[string]parser.ControlStructureParser{}
	for _, name := range []string{"autoescape", "block", "filter", "for", "if", "macro", "raw", "set", "with", "do",
		"break", "continue", "trans", "call"} {
		p, ok := builtins.ControlStructures.Get(name)
		if !ok {
			panic("gonja has no control structure " + name)
		}
		all[name] = p
	}
	macro := all["macro"]
	all["macro"] = func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
		cs, err := macro(p, args)
		if err != nil {
			return nil, err
		}
		m, ok := cs.(*controlStructures.MacroControlStructure)
		if !ok {
			return nil, fmt.Errorf("macro: unexpected node %T", cs)
		}
		return &sandboxMacro{m}, nil
	}
	forLoop := all["for"]
	all["for"] = func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
		cs, err := forLoop(p, args)
		if err != nil {
			return nil, err
		}
		f, ok := cs.(*controlStructures.ForControlStructure)
		if !ok {
			return nil, fmt.Errorf("for: unexpected node %T", cs)
		}
		return &sandboxFor{f}, nil
	}
	return exec.NewControlStructureSet(all)
}

// sandboxFor is a {% for %} that looks at the clock each time it starts, so that loops nested over
// lists made once ({% set r = range(100000) %}) cannot run past the time bound between two calls.
type sandboxFor struct {
	*controlStructures.ForControlStructure
}

func (f *sandboxFor) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	sandboxOf(r.Environment.Context).tick()
	return f.ForControlStructure.Execute(r, tag)
}

// sandboxMacro is a {% macro %} whose calls count one nesting level each.
type sandboxMacro struct {
	*controlStructures.MacroControlStructure
}

func (m *sandboxMacro) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	inner, err := exec.MacroNodeToFunc(m.Macro, r)
	if err != nil {
		return fmt.Errorf("macro %s: %w", m.Name, err)
	}
	s := sandboxOf(r.Environment.Context)
	name := "macro " + m.Name
	r.Environment.Context.Set(m.Name, exec.Macro(func(params *exec.VarArgs) *exec.Value {
		s.enter(name)
		defer s.leave()
		return inner(params)
	}))
	return nil
}

// sandboxCalls rewrites, under root, the operators whose results can grow without bound (a + b,
// a * b, a ~ b) and loop(...) calls into calls of the sandbox's globals. It runs as part of
// pythonize's walk (see rewriter.replacement).
func (w *rewriter) sandboxCall(n any) *nodes.Call {
	switch x := n.(type) {
	case *nodes.BinaryExpression:
		var name string
		switch x.Operator.Token.Val {
		case "+":
			name = addName
		case "*":
			name = mulName
		case "~":
			name = catName
		default:
			return nil
		}
		w.walk(reflect.ValueOf(x))
		return globalCall(x.Operator.Token, name, x.Left, x.Right)
	case *nodes.Call:
		f, ok := x.Func.(*nodes.Name)
		if !ok || f.Name.Val != "loop" || len(x.Kwargs) > 0 {
			return nil
		}
		w.walk(reflect.ValueOf(x))
		args := append([]nodes.Node{f}, nodesOf(x.Args)...)
		return globalCall(f.Name, loopName, args...)
	}
	return nil
}

func nodesOf(exprs []nodes.Expression) []nodes.Node {
	out := make([]nodes.Node, len(exprs))
	for i, e := range exprs {
		out[i] = e
	}
	return out
}

// filterNames are gonja's filters (builtins.Filters), each wrapped by sandboxFilters.
var filterNames = []string{"abs", "attr", "batch", "capitalize", "center", "default", "d", "dictsort", "e", "escape",
	"filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "join", "items", "last",
	"length", "count", "list", "lower", "map", "max", "min", "pprint", "random", "rejectattr", "reject", "replace",
	"reverse", "round", "safe", "selectattr", "select", "slice", "sort", "string", "striptags", "sum", "title",
	"tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"}

// sandboxFilters wraps every filter of set so that its arguments are checked before it runs (see
// checkCall).
func sandboxFilters(set *exec.FilterSet) {
	for _, name := range filterNames {
		f, ok := set.Get(name)
		if !ok {
			continue
		}
		_ = set.Replace(name, func(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
			s := sandboxOf(e.Environment.Context)
			s.checkCall("filter "+name, name, in, params)
			return f(e, in, params)
		})
	}
}

// sandboxMethods wraps the string methods of set (see checkCall).
func sandboxMethods(set map[string]exec.Method[string]) {
	for name, m := range set {
		set[name] = func(self string, v *exec.Value, params *exec.VarArgs) (any, error) {
			// Methods get no evaluator: they share the bounds but not the rendering's clock.
			var s sandbox
			s.checkCall("method "+name, name, exec.AsValue(self), params)
			return m(self, v, params)
		}
	}
}

// checkCall refuses a filter or method call whose result would exceed the bounds, before it runs:
// a size argument beyond maxTemplateBytes (the width or length of center, indent, ljust, rjust,
// zfill, expandtabs, truncate, wordwrap, batch, slice), a number beyond it in a format string, a join or a replace whose result
// would be larger than maxTemplateBytes.
func (s *sandbox) checkCall(what, name string, in *exec.Value, params *exec.VarArgs) {
	if !s.deadline.IsZero() {
		s.tick()
	}
	args := append([]*exec.Value{}, params.Args...)
	for _, v := range params.KwArgs {
		args = append(args, v)
	}
	switch name {
	case "center", "indent", "truncate", "wordwrap", "batch", "slice", "ljust", "rjust", "zfill", "expandtabs":
		for _, a := range args {
			if a.IsInteger() && !a.IsBool() && a.Integer() > maxTemplateBytes {
				s.fail("%s: argument %d exceeds %d", what, a.Integer(), maxTemplateBytes)
			}
		}
	case "format", "format_map":
		for _, num := range formatNumber.FindAllString(in.String(), -1) {
			if n, err := strconv.Atoi(num); err != nil || n > maxTemplateBytes {
				s.fail("%s: width %s exceeds %d", what, num, maxTemplateBytes)
			}
		}
	case "join":
		list, sep := in, ""
		if len(params.Args) > 0 {
			sep = params.Args[0].String()
		}
		if in.IsString() && len(params.Args) > 0 { // the method: sep.join(list)
			list, sep = params.Args[0], in.String()
		}
		if !list.IsList() {
			return
		}
		n := float64(len(sep)) * float64(max(list.Len()-1, 0))
		for i := range list.Len() {
			if n += float64(len(list.Index(i).String())); n > maxTemplateBytes {
				break
			}
		}
		s.checkBytes(n)
	case "replace":
		if len(params.Args) < 2 || !in.IsString() {
			return
		}
		str, old, repl := in.String(), params.Args[0].String(), params.Args[1].String()
		count := strings.Count(str, old)
		s.checkBytes(float64(len(str)) + float64(count)*float64(len(repl)-len(old)))
	}
}

// formatNumber finds the numbers of a format string (widths and precisions).
var formatNumber = regexp.MustCompile(`\d+`)
