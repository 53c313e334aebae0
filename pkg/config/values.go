package config

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Strict value rules, applied while decoding a config (file, --set and DRMAS_ alike):
//   - an integer key takes a whole number that fits its type: 3.7 and 1e30 are errors, 3.0 is 3;
//   - a number key takes a finite number: .nan and .inf are errors;
//   - a duration takes a unit (30s, 2m, 500ms) or a plain number of seconds (30 = 30s);
//   - a key written with no value (`steps:`, `--set run.steps=`, `DRMAS_RUN_STEPS=`) is an error,
//     never a silent return to the built-in default.

var durationType = reflect.TypeOf(time.Duration(0))

// strictHook converts and checks scalar values on their way into the config structs.
func strictHook(from, to reflect.Type, data any) (any, error) {
	if to == durationType {
		return toDuration(data)
	}
	switch to.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return toInt(data, to.Bits())
	case reflect.Float32, reflect.Float64:
		f, ok := number(data)
		if !ok {
			return data, nil // mapstructure reports the wrong type
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("must be a finite number (got %v)", f)
		}
		return f, nil
	}
	return data, nil
}

// number returns data as a float64 when it is any numeric kind.
func number(data any) (float64, bool) {
	v := reflect.ValueOf(data)
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		return v.Float(), true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return float64(v.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return float64(v.Uint()), true
	}
	return 0, false
}

func toInt(data any, bits int) (any, error) {
	v := reflect.ValueOf(data)
	lo, hi := int64(-1)<<(bits-1), int64(1)<<(bits-1)-1
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if i := v.Int(); i < lo || i > hi {
			return nil, fmt.Errorf("%d does not fit a %d-bit integer", i, bits)
		}
		return v.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if u := v.Uint(); u > uint64(hi) {
			return nil, fmt.Errorf("%d does not fit a %d-bit integer", u, bits)
		}
		return int64(v.Uint()), nil
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if f != math.Trunc(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("want a whole number, got %v", f)
		}
		// float64(hi) rounds up to 2^(bits-1), which does not fit.
		if f < float64(lo) || f >= float64(hi) {
			return nil, fmt.Errorf("%v does not fit a %d-bit integer", f, bits)
		}
		return int64(f), nil
	}
	return data, nil // mapstructure reports the wrong type
}

func toDuration(data any) (any, error) {
	if s, ok := data.(string); ok {
		s = strings.TrimSpace(s)
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return seconds(f)
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("want a duration such as 30s, 2m or 500ms, or a number of seconds (got %q)", s)
		}
		return d, nil
	}
	if f, ok := number(data); ok {
		return seconds(f)
	}
	return data, nil
}

// seconds turns a plain number into a duration in seconds.
func seconds(f float64) (time.Duration, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > float64(math.MaxInt64)/float64(time.Second) {
		return 0, fmt.Errorf("%v seconds is not a usable duration", f)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// nullKeys lists the dotted keys of the tree that hold no value (YAML null, `key:` with nothing).
func nullKeys(node any, prefix string) []string {
	var out []string
	switch t := node.(type) {
	case nil:
		if prefix != "" {
			out = append(out, prefix)
		}
	case map[string]any:
		for k, v := range t {
			out = append(out, nullKeys(v, join(prefix, k))...)
		}
	case []any:
		for i, v := range t {
			out = append(out, nullKeys(v, join(prefix, strconv.Itoa(i)))...)
		}
	}
	sort.Strings(out)
	return out
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// origins records where override values came from, by dotted key (list entries by index).
type origins map[string]string

var indexRE = regexp.MustCompile(`\[(\d+)\]`)

// of returns the origin of the value an error about key (dotted, or with [i] indices) concerns:
// the override that set this key or a section above it, or "" for the file.
func (o origins) of(key string) string {
	key = indexRE.ReplaceAllString(key, ".$1")
	best, src := -1, ""
	for k, s := range o {
		if (key == k || strings.HasPrefix(key, k+".")) && len(k) > best {
			best, src = len(k), s
		}
	}
	return src
}

// annotate adds, to each problem ("key: message"), where its value came from when it was an
// override, and joins them into one line after the file's name.
func (o origins) annotate(path string, problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	out := make([]string, len(problems))
	for i, p := range problems {
		key, _, _ := strings.Cut(p, ": ")
		key = strings.TrimPrefix(key, "unknown key ")
		if src := o.of(key); src != "" {
			p += " (value from " + src + ")"
		}
		out[i] = p
	}
	sort.Strings(out)
	return fmt.Errorf("%s: %s", path, strings.Join(out, "; "))
}

// problems splits an error of joined problems (newlines or "; ") into one string per problem.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(err.Error(), "\n") {
		for _, p := range strings.Split(line, "; ") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}
