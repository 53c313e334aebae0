package train

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"

	"github.com/drmas/drmas/pkg/jsonl"
)

// Metrics is one iteration's figures, keyed as in docs/contracts.md.
type Metrics map[string]float64

// MarshalJSON writes step and epoch first, then the other keys sorted; a value that is not finite
// is written as null and counted in `nonfinite_values`.
func (m Metrics) MarshalJSON() ([]byte, error) {
	keys := make([]string, 0, len(m))
	bad := 0
	for k, v := range m {
		if k != "step" && k != "epoch" {
			keys = append(keys, k)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			bad++
		}
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteByte('{')
	write := func(k string, v float64) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(jsonl.AppendNum(nil, v))
	}
	for _, k := range []string{"step", "epoch"} {
		if v, ok := m[k]; ok {
			write(k, v)
		}
	}
	for _, k := range keys {
		write(k, m[k])
	}
	if bad > 0 {
		write("nonfinite_values", float64(bad))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
