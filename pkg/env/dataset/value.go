package dataset

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// lookup finds the value at a dotted field path in a decoded record. A key that itself contains
// dots is found too (the longest matching key wins), a numeric component indexes a list
// (`prompt.0.content`), and a JSON null or Parquet null counts as absent.
func lookup(rec map[string]any, path string) (any, bool) {
	parts := strings.Split(path, ".")
	var cur any = rec
	for i := 0; i < len(parts); {
		switch c := cur.(type) {
		case map[string]any:
			// Try the longest run of remaining components as one key first.
			found := false
			for j := len(parts); j > i; j-- {
				if v, ok := c[strings.Join(parts[i:j], ".")]; ok {
					cur, i, found = v, j, true
					break
				}
			}
			if !found {
				return nil, false
			}
		case []any:
			n, err := strconv.Atoi(parts[i])
			if err != nil || n < 0 || n >= len(c) {
				return nil, false
			}
			cur, i = c[n], i+1
		default:
			return nil, false
		}
		if cur == nil {
			return nil, false
		}
	}
	return cur, true
}

// keys lists the top-level field names of a record, for error messages.
func keys(rec map[string]any) string {
	ks := make([]string, 0, len(rec))
	for k := range rec {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// scalarString renders a scalar field value (string, number, bool, bytes) as text.
func scalarString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	case json.Number:
		return x.String(), nil
	case bool:
		return strconv.FormatBool(x), nil
	case float64:
		return formatFloat(x), nil
	case float32:
		return formatFloat(float64(x)), nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x), nil
	case []any:
		return "", fmt.Errorf("is a list, want a single value")
	case map[string]any:
		return "", fmt.Errorf("is a struct, want a single value (name a sub-field with a dotted path)")
	default:
		return "", fmt.Errorf("has unsupported type %T", v)
	}
}

// formatFloat prints integral floats without a fraction (Parquet doubles holding 72 read as "72").
func formatFloat(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// answerStrings turns an answer field into gold answers: a scalar gives one answer, a list one per
// element, and a struct with a `target` field (Search-R1 stores `reward_model.ground_truth` as
// `{"target": [...]}`) its target.
func answerStrings(v any) ([]string, error) {
	switch x := v.(type) {
	case []any:
		out := make([]string, 0, len(x))
		for i, e := range x {
			if e == nil {
				continue
			}
			s, err := scalarString(e)
			if err != nil {
				return nil, fmt.Errorf("element %d %w", i, err)
			}
			out = append(out, s)
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("is an empty list")
		}
		return out, nil
	case map[string]any:
		if t, ok := x["target"]; ok && t != nil {
			return answerStrings(t)
		}
		return nil, fmt.Errorf("is a struct with fields (%s), want a string or a list (name a sub-field with a dotted path)", keys(x))
	default:
		s, err := scalarString(v)
		if err != nil {
			return nil, err
		}
		return []string{s}, nil
	}
}
