package dataset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/drmas/drmas/pkg/files"

	"github.com/drmas/drmas/pkg/jsonl"
	"github.com/parquet-go/parquet-go"
)

// recordFunc receives one decoded record; where names it for errors ("file:12" or "file: row 3")
// and idx is its 0-based index among the file's records. Returning an error stops the reading.
type recordFunc func(rec map[string]any, where string, idx int) error

// badText counts the records of a file with invalid UTF-8 and names the first, for the warning Load
// gives: JSON decoding reads each bad byte as U+FFFD, Parquet strings keep their bytes.
type badText struct {
	records int
	first   string
}

// note counts the record at where.
func (b *badText) note(where string) {
	if b.records == 0 {
		b.first = where
	}
	b.records++
}

// readJSONL streams the objects of a JSON lines file; blank lines are skipped. Lines with invalid
// UTF-8 are noted in bad.
func readJSONL(path string, fn recordFunc, bad *badText) error {
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
		if !utf8.Valid(l.Text) {
			bad.note(where)
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
// map[string]any, LIST and repeated columns []any, leaves Go scalars. Rows with a string of invalid
// UTF-8 are noted in bad.
func readParquet(path string, fn recordFunc, bad *badText) error {
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
			where := fmt.Sprintf("%s: row %d", path, idx)
			if !validText(rec) {
				bad.note(where)
			}
			if err := fn(rec, where, idx); err != nil {
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

// validText says whether every string in v (a record's value, at any depth) is valid UTF-8.
func validText(v any) bool {
	switch x := v.(type) {
	case string:
		return utf8.ValidString(x)
	case []byte:
		return true // binary data, not text
	case map[string]any:
		for k, e := range x {
			if !utf8.ValidString(k) || !validText(e) {
				return false
			}
		}
	case []any:
		for _, e := range x {
			if !validText(e) {
				return false
			}
		}
	}
	return true
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
