package train

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/jsonl"
)

// Metrics is one iteration's figures, keyed as in DESIGN.md §7.
type Metrics map[string]float64

// MetricsFile is the name of the metrics log in a run folder.
const MetricsFile = "metrics.jsonl"

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
		if math.IsNaN(v) || math.IsInf(v, 0) {
			b.WriteString("null")
		} else {
			b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		}
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

// appendMetrics appends one row to the run's metrics file.
func appendMetrics(dir string, m Metrics) error {
	f, err := os.OpenFile(filepath.Join(dir, MetricsFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	b, _ := m.MarshalJSON()
	b = append(b, '\n')
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// truncateMetrics drops the rows after step (and any malformed line) from the run's metrics file, so
// that a resumed run continues it where its checkpoint was taken.
func truncateMetrics(dir string, step int) error {
	path := filepath.Join(dir, MetricsFile)
	var out bytes.Buffer
	_, err := jsonl.ReadFile(path, func(l jsonl.Line) error {
		var row struct {
			Step *float64 `json:"step"`
		}
		if json.Unmarshal(l.Text, &row) == nil && row.Step != nil && int(*row.Step) <= step {
			out.Write(l.Text)
			out.WriteByte('\n')
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return atomicfile.WriteBytes(path, out.Bytes())
}
