package tokenizer

import (
	"fmt"
	"maps"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// Python's string methods where gonja's differ. gonja v2.9.1 rejects the
// argument-less forms (" a ".strip(), "a b".split(), s.rstrip()), requires
// replace's count, and returns byte offsets from find/rfind; its reverse
// filter sorts as it reverses. These replacements follow CPython.

// gonjaStrMethods are the string methods gonja has; all are kept, and those
// in pyStrMethods are replaced.
var gonjaStrMethods = []string{
	"capitalize", "capwords", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find",
	"format", "format_map", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "islower", "isnumeric",
	"isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "partition",
	"removeprefix", "removesuffix", "replace", "rfind", "rjust", "rpartition", "rsplit", "rstrip", "split",
	"splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill",
}

var pyStrMethods = map[string]exec.Method[string]{
	"split":   func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pySplit(s, a, false) },
	"rsplit":  func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pySplit(s, a, true) },
	"strip":   func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pyStrip(s, a, true, true) },
	"lstrip":  func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pyStrip(s, a, true, false) },
	"rstrip":  func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pyStrip(s, a, false, true) },
	"replace": pyReplace,
	"count":   pyCount,
	"find":    func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pyFind(s, a, false) },
	"rfind":   func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pyFind(s, a, true) },
}

// pythonMethods is gonja's method table with the string methods above.
func pythonMethods() exec.Methods {
	str := map[string]exec.Method[string]{}
	for _, name := range gonjaStrMethods {
		if m, ok := builtins.Methods.Str.Get(name); ok {
			str[name] = m
		}
	}
	for name, m := range pyStrMethods {
		str[name] = m
	}
	sandboxMethods(str)
	out := builtins.Methods
	out.Str = exec.NewMethodSet(str)
	dict := map[string]exec.Method[map[string]any]{}
	for _, name := range []string{"keys", "values", "items", "get", "pop", "setdefault", "update", "copy", "clear"} {
		if m, ok := builtins.Methods.Dict.Get(name); ok {
			dict[name] = m
		}
	}
	maps.Copy(dict, dictMethods)
	out.Dict = exec.NewMethodSet(dict)
	return out
}

// argument returns the i-th positional argument or the keyword argument
// name; nil when absent or None.
func argument(a *exec.VarArgs, i int, name string) *exec.Value {
	var v *exec.Value
	if i < len(a.Args) {
		v = a.Args[i]
	} else if kw, ok := a.KwArgs[name]; ok {
		v = kw
	}
	if v == nil || v.IsNil() {
		return nil
	}
	return v
}

// stringArgument is argument for a str parameter.
func stringArgument(a *exec.VarArgs, i int, name string) (string, bool, error) {
	v := argument(a, i, name)
	if v == nil {
		return "", false, nil
	}
	if !v.IsString() {
		return "", false, fmt.Errorf("%s must be str or None, not %s", name, v.String())
	}
	return v.String(), true, nil
}

// intArgument is argument for an int parameter with a default.
func intArgument(a *exec.VarArgs, i int, name string, dflt int) (int, error) {
	v := argument(a, i, name)
	if v == nil {
		return dflt, nil
	}
	if !v.IsInteger() {
		return 0, fmt.Errorf("%s must be an integer, not %s", name, v.String())
	}
	return v.Integer(), nil
}

// pySplit is str.split(sep=None, maxsplit=-1), or str.rsplit.
func pySplit(s string, a *exec.VarArgs, right bool) (any, error) {
	sep, hasSep, err := stringArgument(a, 0, "sep")
	if err != nil {
		return nil, err
	}
	maxsplit, err := intArgument(a, 1, "maxsplit", -1)
	if err != nil {
		return nil, err
	}
	var parts []string
	switch {
	case hasSep && sep == "":
		return nil, fmt.Errorf("empty separator")
	case hasSep && maxsplit < 0:
		parts = strings.Split(s, sep)
	case hasSep && !right:
		parts = strings.SplitN(s, sep, maxsplit+1)
	case hasSep:
		parts = rsplitN(s, sep, maxsplit)
	default:
		parts = splitSpace(s, maxsplit, right)
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

// rsplitN splits s at the last n occurrences of sep.
func rsplitN(s, sep string, n int) []string {
	var rev []string
	for ; n > 0; n-- {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
	}
	out := []string{s}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

// splitSpace is Python's split on runs of whitespace with at most maxsplit
// splits (negative: no limit); the unsplit rest keeps its whitespace,
// except at the end where the split starts.
func splitSpace(s string, maxsplit int, right bool) []string {
	if maxsplit < 0 {
		return strings.FieldsFunc(s, unicode.IsSpace)
	}
	var out []string
	if !right {
		rest := strings.TrimLeftFunc(s, unicode.IsSpace)
		for ; maxsplit > 0 && rest != ""; maxsplit-- {
			i := strings.IndexFunc(rest, unicode.IsSpace)
			if i < 0 {
				break
			}
			out = append(out, rest[:i])
			rest = strings.TrimLeftFunc(rest[i:], unicode.IsSpace)
		}
		if rest != "" {
			out = append(out, rest)
		}
		return out
	}
	rest := strings.TrimRightFunc(s, unicode.IsSpace)
	var rev []string
	for ; maxsplit > 0 && rest != ""; maxsplit-- {
		i := strings.LastIndexFunc(rest, unicode.IsSpace)
		if i < 0 {
			break
		}
		_, size := utf8.DecodeRuneInString(rest[i:])
		rev = append(rev, rest[i+size:])
		rest = strings.TrimRightFunc(rest[:i], unicode.IsSpace)
	}
	if rest != "" {
		out = append(out, rest)
	}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

// pyStrip is str.strip(chars=None) (lstrip: right false; rstrip: left false).
func pyStrip(s string, a *exec.VarArgs, left, right bool) (any, error) {
	chars, has, err := stringArgument(a, 0, "chars")
	if err != nil {
		return nil, err
	}
	cut := unicode.IsSpace
	if has {
		cut = func(r rune) bool { return strings.ContainsRune(chars, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s, nil
}

// pyReplace is str.replace(old, new, count=-1).
func pyReplace(s string, _ *exec.Value, a *exec.VarArgs) (any, error) {
	old, ok1, err := stringArgument(a, 0, "old")
	if err != nil {
		return nil, err
	}
	repl, ok2, err := stringArgument(a, 1, "new")
	if err != nil {
		return nil, err
	}
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("replace expected at least 2 arguments")
	}
	count, err := intArgument(a, 2, "count", -1)
	if err != nil {
		return nil, err
	}
	return strings.Replace(s, old, repl, count), nil
}

// pyCount is str.count(sub): non-overlapping occurrences.
func pyCount(s string, _ *exec.Value, a *exec.VarArgs) (any, error) {
	sub, ok, err := stringArgument(a, 0, "sub")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("count expected a str argument")
	}
	return strings.Count(s, sub), nil
}

// pyFind is str.find(sub) / str.rfind(sub): a code-point index, or -1.
func pyFind(s string, a *exec.VarArgs, last bool) (any, error) {
	sub, ok, err := stringArgument(a, 0, "sub")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("find expected a str argument")
	}
	i := strings.Index(s, sub)
	if last {
		i = strings.LastIndex(s, sub)
	}
	if i < 0 {
		return -1, nil
	}
	return len([]rune(s[:i])), nil
}

// filterReverse is jinja2's reverse: a string backwards by code point, a
// list in reverse order (gonja's sorts it as well).
func filterReverse(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	switch {
	case in.IsError():
		return in
	case in.IsString():
		r := []rune(in.String())
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return exec.AsValue(string(r))
	case in.IsList():
		n := in.Len()
		out := make([]any, n)
		for i := range n {
			out[n-1-i] = in.Index(i).Interface()
		}
		return exec.AsValue(out)
	}
	return exec.AsValue(fmt.Errorf("reverse: cannot reverse %s", in.String()))
}
