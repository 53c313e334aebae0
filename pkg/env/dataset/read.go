package dataset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/drmas/drmas/pkg/files"

	"github.com/drmas/drmas/pkg/jsonl"
	"github.com/parquet-go/parquet-go"
)

// recordFunc receives one decoded record; where names it for errors ("file:12" or "file: row 3")
// and idx is its 0-based index among the file's records. Returning an error stops the reading.
type recordFunc func(rec map[string]any, where string, idx int) error

// readJSONL streams the objects of a JSON lines file; blank lines are skipped.
func readJSONL(path string, fn recordFunc) error {
	f, err := files.Open(path, 0)
	if err != nil {
		return fmt.Errorf("open dataset: %w", err)
	}
	defer f.Close()
	idx := 0
	_, err = jsonl.Read(f, path, func(l jsonl.Line) error {
		where := fmt.Sprintf("%s:%d", path, l.N)
		rec, err := decodeLine(l.Text)
		if err != nil {
			if idx == 0 && l.Text[0] == '[' {
				return fmt.Errorf("%s: a JSON array; want JSON lines (one object per line)", where)
			}
			return fmt.Errorf("%s: %w", where, err)
		}
		idx++
		return fn(rec, where, idx-1)
	})
	return err
}

// decodeLine decodes one JSON object, keeping numbers as json.Number so IDs and answers keep
// their exact spelling.
func decodeLine(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("malformed JSON: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("malformed JSON: more than one value on the line")
	}
	rec, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("malformed JSON: a %s, want an object", jsonKind(v))
	}
	return rec, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "list"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	}
	return fmt.Sprintf("%T", v)
}

// parquetBatch is how many rows are decoded at a time.
const parquetBatch = 256

// readParquet streams the rows of a Parquet file as generic records: groups (structs) become
// map[string]any, LIST and repeated columns []any, leaves Go scalars.
func readParquet(path string, fn recordFunc) error {
	f, err := files.Open(path, 0)
	if err != nil {
		return fmt.Errorf("open dataset: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("open dataset: %w", err)
	}
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		return fmt.Errorf("%s: not a readable Parquet file: %w", path, err)
	}
	r := parquet.NewGenericReader[map[string]any](pf, pf.Schema())
	defer r.Close()

	idx := 0
	for {
		rows := make([]map[string]any, parquetBatch)
		for i := range rows {
			rows[i] = map[string]any{}
		}
		n, readErr := readRows(r, rows)
		for _, rec := range rows[:n] {
			if err := fn(rec, fmt.Sprintf("%s: row %d", path, idx), idx); err != nil {
				return err
			}
			idx++
		}
		if errors.Is(readErr, io.EOF) || (readErr == nil && n == 0) {
			return nil
		}
		if readErr != nil {
			return fmt.Errorf("%s: row %d: read Parquet: %w", path, idx, readErr)
		}
	}
}

// readRows reads a batch, turning the reader's panics on rows it cannot reconstruct (a schema
// that does not match the file's data) into errors.
func readRows(r *parquet.GenericReader[map[string]any], rows []map[string]any) (n int, err error) {
	defer func() {
		if p := recover(); p != nil {
			n, err = 0, fmt.Errorf("decode row: %v", p)
		}
	}()
	return r.Read(rows)
}
