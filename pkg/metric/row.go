package metric

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"

	"github.com/drmas/drmas/pkg/jsonl"
)

// Row is one iteration's figures, keyed as in docs/contracts.md: a line of metrics.jsonl.
type Row map[string]float64

// MarshalJSON writes step and epoch first, then the other keys sorted; a value that is not finite
// is written as null and counted in nonfinite_values.
func (m Row) MarshalJSON() ([]byte, error) {
	keys := make([]string, 0, len(m))
	bad := 0
	for k, v := range m {
		if k != Step && k != Epoch {
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
	for _, k := range []string{Step, Epoch} {
		if v, ok := m[k]; ok {
			write(k, v)
		}
	}
	for _, k := range keys {
		write(k, m[k])
	}
	if bad > 0 {
		write(NonfiniteValues, float64(bad))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
