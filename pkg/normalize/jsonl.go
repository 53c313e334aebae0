package normalize

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/drmas/drmas/pkg/jsonl"
)

// Record is one line of a samples file (JSON lines): the Sample it holds and the line itself, so that
// WriteRecords writes it back byte for byte with only the advantage added or replaced.
type Record struct {
	Sample Sample
	Line   int // 1-based line number in the input

	raw              []byte // the line without surrounding whitespace: one JSON object
	advStart, advEnd int    // byte range of an existing "advantage" value in raw; advStart < 0 if none
}

// LineError is an error in one line of a samples file. Its text is "name:line: message".
type LineError struct {
	Name string
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.Name, e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// ReadSamples reads a samples file; see ReadRecords.
func ReadSamples(r io.Reader, name string) ([]Sample, error) {
	recs, err := ReadRecords(r, name)
	if err != nil {
		return nil, err
	}
	samples := make([]Sample, len(recs))
	for i := range recs {
		samples[i] = recs[i].Sample
	}
	return samples, nil
}

// ReadRecords reads JSON lines, one object per agent call with the fields uid, traj_uid, agent (non-empty
// strings; uid and traj_uid may also be numbers, kept as written) and score (a number within ±MaxScore).
// Other fields are kept for WriteRecords. Blank lines are skipped. The first bad line stops the read with
// a *LineError naming name and the line: malformed JSON, a missing, empty, duplicated or mistyped field,
// or a score that is not finite (NaN or Infinity as Python's json writes them, or a number that
// overflows).
func ReadRecords(r io.Reader, name string) ([]Record, error) {
	var recs []Record
	_, err := jsonl.Read(r, name, func(l jsonl.Line) error {
		rec, err := parseRecord(l.Text)
		if err != nil {
			return &LineError{Name: name, Line: l.N, Err: err}
		}
		rec.Line = l.N
		recs = append(recs, rec)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return recs, nil
}

// The fields a samples line is read for, as bits of lineParser.seen.
const (
	fieldUID = 1 << iota
	fieldTrajUID
	fieldAgent
	fieldScore
	fieldAdvantage
	fieldOther = 0
)

var fieldNames = map[int]string{fieldUID: "uid", fieldTrajUID: "traj_uid", fieldAgent: "agent", fieldScore: "score", fieldAdvantage: "advantage"}

// fieldOf names a key, given as its JSON string literal with the quotes, by its field bit.
func fieldOf(lit []byte) int {
	name := lit[1 : len(lit)-1]
	if bytes.IndexByte(name, '\\') >= 0 { // escaped: decode it (rare)
		var s string
		if json.Unmarshal(lit, &s) != nil {
			return fieldOther
		}
		name = []byte(s)
	}
	return fieldByName(name)
}

// fieldByName names a decoded key by its field bit.
func fieldByName(name []byte) int {
	switch string(name) {
	case "uid":
		return fieldUID
	case "traj_uid":
		return fieldTrajUID
	case "agent":
		return fieldAgent
	case "score":
		return fieldScore
	case "advantage":
		return fieldAdvantage
	}
	return fieldOther
}

// lineParser collects one line's sample from its top-level fields.
type lineParser struct {
	rec  Record
	seen int // field bits
}

// field takes the value raw = line[start:end] of the field with bit f.
func (p *lineParser) field(f int, raw []byte, start, end int) error {
	if f == fieldOther {
		return nil
	}
	if p.seen&f != 0 {
		return fmt.Errorf("duplicate field %q", fieldNames[f])
	}
	p.seen |= f
	var err error
	switch f {
	case fieldUID:
		p.rec.Sample.UID, err = idField("uid", raw, true)
	case fieldTrajUID:
		p.rec.Sample.TrajUID, err = idField("traj_uid", raw, true)
	case fieldAgent:
		p.rec.Sample.Agent, err = idField("agent", raw, false)
	case fieldScore:
		p.rec.Sample.Score, err = scoreField(raw)
	case fieldAdvantage:
		p.rec.advStart, p.rec.advEnd = start, end
	}
	return err
}

// parseRecord parses one non-blank line. Valid JSON (nearly every line) takes a quick walk over the
// object's top-level fields; anything else goes through encoding/json's decoder, which names the fault.
func parseRecord(line []byte) (Record, error) {
	p := lineParser{rec: Record{raw: line, advStart: -1, advEnd: -1}}
	var err error
	if json.Valid(line) {
		err = p.walk(line)
	} else if err = p.decode(line); err == nil {
		err = errors.New("malformed JSON") // not reached: the decoder rejects what Valid rejects
	}
	if err != nil {
		return p.rec, err
	}
	for _, f := range []int{fieldUID, fieldTrajUID, fieldAgent, fieldScore} {
		if p.seen&f == 0 {
			return p.rec, fmt.Errorf("missing field %q", fieldNames[f])
		}
	}
	return p.rec, nil
}

// walk visits the top-level fields of b, which must be valid JSON.
func (p *lineParser) walk(b []byte) error {
	i := skipSpace(b, 0)
	if b[i] != '{' {
		return fmt.Errorf("want a JSON object, got %s", describe(b[i:]))
	}
	i = skipSpace(b, i+1)
	if b[i] == '}' {
		return nil
	}
	for {
		k := i
		i = skipString(b, i)
		f := fieldOf(b[k:i])
		i = skipSpace(b, skipSpace(b, i)+1) // the colon
		v := i
		i = skipValue(b, i)
		if err := p.field(f, b[v:i], v, i); err != nil {
			return err
		}
		i = skipSpace(b, i)
		if b[i] == '}' {
			return nil
		}
		i = skipSpace(b, i+1) // the comma
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string literal starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index after the JSON value starting at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) && !strings.ContainsRune(",}] \t\r\n", rune(b[i])) {
		i++
	}
	return i
}

// decode walks the fields of b with encoding/json's decoder, for its error messages on invalid lines,
// and names a NaN or Infinity score (as Python's json writes them) as such.
func (p *lineParser) decode(line []byte) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	} else if tok != json.Delim('{') {
		return fmt.Errorf("want a JSON object, got %s", describe(bytes.TrimLeft(line, " \t\r\n")))
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("malformed JSON: %w", err)
		}
		key, _ := tok.(string) // inside an object the decoder returns only string keys
		keyEnd := int(dec.InputOffset())
		f := fieldByName([]byte(key))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if f == fieldScore && nonFiniteLiteral(line[keyEnd:]) {
				return errors.New(`field "score": not a finite number`)
			}
			return fmt.Errorf("malformed JSON: %w", err)
		}
		end := int(dec.InputOffset())
		if err := p.field(f, raw, end-len(raw), end); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("malformed JSON: data after the object")
	}
	return nil
}

// idField decodes a non-empty string, or with numbers a JSON number kept as written.
func idField(key string, raw json.RawMessage, numbers bool) (string, error) {
	if numbers && isNumber(raw) {
		return string(raw), nil
	}
	var s string
	if raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 {
		s = string(raw[1 : len(raw)-1])
	} else if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		want := "a string"
		if numbers {
			want = "a string or a number"
		}
		return "", fmt.Errorf("field %q: want %s, got %s", key, want, describe(raw))
	}
	if s == "" {
		return "", fmt.Errorf("field %q is empty", key)
	}
	return s, nil
}

// scoreField decodes a finite number within ±MaxScore.
func scoreField(raw json.RawMessage) (float64, error) {
	if !isNumber(raw) {
		return 0, fmt.Errorf(`field "score": want a number, got %s`, describe(raw))
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil && !math.IsInf(v, 0) {
		return 0, fmt.Errorf(`field "score": %w`, err)
	}
	if math.IsInf(v, 0) {
		return 0, fmt.Errorf(`field "score": %s is not a finite number`, raw)
	}
	if math.Abs(v) > MaxScore {
		return 0, fmt.Errorf(`field "score": %s is beyond ±%g`, raw, MaxScore)
	}
	return v, nil
}

func isNumber(raw []byte) bool { return raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9') }

// describe names the JSON type of a value for error messages.
func describe(raw []byte) string {
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// nonFiniteLiteral reports whether rest, the line after a key, holds a NaN or Infinity value as
// Python's json module and others write them (not JSON, so the decoder rejects them).
func nonFiniteLiteral(rest []byte) bool {
	s := strings.TrimLeft(string(rest), " \t:")
	s = strings.TrimLeft(s, "+-")
	s = strings.ToLower(s)
	return strings.HasPrefix(s, "nan") || strings.HasPrefix(s, "inf")
}

// WriteRecords writes each record's line with "advantage" set to adv[i]: appended as the last field,
// or replacing the value of an existing "advantage" field in place. Every other byte of the line is
// kept. The number is written in the shortest form that reads back to the same float64.
func WriteRecords(w io.Writer, recs []Record, adv []float64) error {
	if len(adv) != len(recs) {
		return fmt.Errorf("write records: %d records but %d advantages", len(recs), len(adv))
	}
	bw := bufio.NewWriter(w)
	var num []byte
	var err error
	for i := range recs {
		if num, err = writeRecord(bw, &recs[i], adv[i], num); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write records: %w", err)
	}
	return nil
}

// writeRecord writes one record's line with its advantage v (see WriteRecords); num is scratch.
func writeRecord(bw *bufio.Writer, rec *Record, v float64, num []byte) ([]byte, error) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return num, fmt.Errorf("write records: line %d: advantage %v is not finite", rec.Line, v)
	}
	num = strconv.AppendFloat(num[:0], v, 'g', -1, 64)
	raw := rec.raw
	if rec.advStart >= 0 {
		bw.Write(raw[:rec.advStart])
		bw.Write(num)
		bw.Write(raw[rec.advEnd:])
	} else {
		bw.Write(raw[:len(raw)-1]) // all but the closing brace
		bw.WriteString(`,"advantage":`)
		bw.Write(num)
		bw.WriteByte('}')
	}
	return num, bw.WriteByte('\n')
}

// WriteStatsJSON writes st as json.MarshalIndent(st, "", "  ") does, and a newline, encoding the
// per-group statistics (most of the bytes on a large input) one group at a time.
func WriteStatsJSON(w io.Writer, st Stats) error {
	groups := st.PerGroup
	st.PerGroup = []GroupStats{}
	head, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode statistics: %w", err)
	}
	const empty = "[]\n}"
	if !bytes.HasSuffix(head, []byte(`"per_group": `+empty)) {
		return fmt.Errorf("encode statistics: per_group is not the last field")
	}
	bw := bufio.NewWriter(w)
	if len(groups) == 0 {
		bw.Write(head)
	} else {
		bw.Write(head[:len(head)-len(empty)])
		bw.WriteString("[\n")
		for i := range groups {
			if i > 0 {
				bw.WriteString(",\n")
			}
			b, err := json.MarshalIndent(groups[i], "    ", "  ")
			if err != nil {
				return fmt.Errorf("encode statistics: %w", err)
			}
			bw.WriteString("    ")
			bw.Write(b)
		}
		bw.WriteString("\n  ]\n}")
	}
	bw.WriteByte('\n')
	return bw.Flush()
}
