package train

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
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
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var row struct {
			Step *float64 `json:"step"`
		}
		if json.Unmarshal(sc.Bytes(), &row) != nil || row.Step == nil || int(*row.Step) > step {
			continue
		}
		out.Write(sc.Bytes())
		out.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return writeAtomic(path, out.Bytes())
}

// writeAtomic writes a file through a temporary file and a rename.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
