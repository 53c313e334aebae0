package normalize

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
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

// SamplesFile is a samples file indexed for Advantages, which computes and writes its advantages
// without holding its records: the index keeps, per record, its prompt group and where its line
// starts (12 bytes, in fixed-size blocks that are never copied), and the groups are read back one at
// a time.
type SamplesFile struct {
	r    io.ReaderAt
	size int64
	name string

	uids       interner
	gid        blocks[int32] // group of each record, in order of each uid's first record
	off        blocks[int64] // where each record's line starts
	contiguous bool          // every uid's records are consecutive
	maxGroup   int
}

// blocks is an append-only sequence in blocks of blockLen values: growing it never copies (a slice
// grown by append would, briefly holding twice its size).
type blocks[T any] struct {
	b [][]T
	n int
}

const blockLen = 1 << 16

func (s *blocks[T]) add(v T) {
	if s.n%blockLen == 0 {
		s.b = append(s.b, make([]T, 0, blockLen))
	}
	s.b[len(s.b)-1] = append(s.b[len(s.b)-1], v)
	s.n++
}

func (s *blocks[T]) at(i int) T { return s.b[i/blockLen][i%blockLen] }

// ScanSamples reads the samples file r (size bytes, name for messages) once, checking every line as
// ReadRecords does (the first bad line is a *LineError), and indexes its records by prompt group.
func ScanSamples(r io.ReaderAt, size int64, name string) (*SamplesFile, error) {
	sf := &SamplesFile{r: r, size: size, name: name, contiguous: true}
	prev, run := int32(-1), 0
	var count []int32 // records per group, once the input is found not to be contiguous
	_, err := jsonl.Read(io.NewSectionReader(r, 0, size), name, func(l jsonl.Line) error {
		rec, err := parseRecord(l.Text)
		if err != nil {
			return &LineError{Name: name, Line: l.N, Err: err}
		}
		if sf.gid.n == math.MaxInt32 {
			return &LineError{Name: name, Line: l.N, Err: fmt.Errorf("more than %d samples", math.MaxInt32)}
		}
		before := len(sf.uids.names)
		g := sf.uids.id(rec.Sample.UID)
		if sf.contiguous {
			switch {
			case g == prev:
				run++
			case len(sf.uids.names) > before: // a new uid starts a run
				run = 1
			default: // a uid seen before reappears: count the records of every group
				sf.contiguous = false
				count = make([]int32, len(sf.uids.names))
				for i := 0; i < sf.gid.n; i++ {
					count[sf.gid.at(i)]++
				}
			}
		}
		if sf.contiguous {
			sf.maxGroup = max(sf.maxGroup, run)
		} else {
			for len(count) < len(sf.uids.names) {
				count = append(count, 0)
			}
			count[g]++
			sf.maxGroup = max(sf.maxGroup, int(count[g]))
		}
		prev = g
		sf.gid.add(g)
		sf.off.add(l.Offset)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sf, nil
}

// Len is the number of records.
func (sf *SamplesFile) Len() int { return sf.gid.n }

// Advantages computes every record's advantage under opt, as Compute on ReadRecords' samples would,
// and writes the records to w as WriteRecords would; with groupStats false the statistics leave out
// the per-group ones (Stats.PerGroup). Memory beyond the index: the largest group when every
// uid's records are consecutive, else one float64 per record. The file must not change after
// ScanSamples (a line that reads differently is an error).
func (sf *SamplesFile) Advantages(w io.Writer, opt Options, groupStats bool) (Stats, error) {
	st, err := NewStream(opt)
	if err != nil {
		return Stats{}, err
	}
	if !groupStats {
		st.DropGroupStats()
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	if sf.contiguous {
		err = sf.writeRuns(bw, st)
	} else {
		err = sf.writeInterleaved(bw, st)
	}
	if err != nil {
		return Stats{}, err
	}
	if err := bw.Flush(); err != nil {
		return Stats{}, fmt.Errorf("write records: %w", err)
	}
	return st.Finish(), nil
}

func (sf *SamplesFile) changed(line int, what string) error {
	return &LineError{Name: sf.name, Line: line, Err: fmt.Errorf("%s since it was first read: the file changed", what)}
}

// writeRuns reads the file once more, a group (a run of records) at a time: each group's advantages
// are computed and its lines written before the next is read.
func (sf *SamplesFile) writeRuns(bw *bufio.Writer, st *Stream) error {
	var recs []Record
	var samples []Sample
	var num []byte
	flush := func() error {
		adv, err := st.Group(samples)
		if err != nil {
			return err
		}
		for k := range recs {
			if num, err = writeRecord(bw, &recs[k], adv[k], num); err != nil {
				return err
			}
		}
		recs, samples = recs[:0], samples[:0]
		return nil
	}
	i := 0
	_, err := jsonl.Read(io.NewSectionReader(sf.r, 0, sf.size), sf.name, func(l jsonl.Line) error {
		if i >= sf.gid.n {
			return sf.changed(l.N, "more records")
		}
		rec, err := parseRecord(l.Text)
		g := sf.gid.at(i)
		if err != nil || rec.Sample.UID != sf.uids.names[g] {
			return sf.changed(l.N, "the line differs")
		}
		if i > 0 && g != sf.gid.at(i-1) {
			if err := flush(); err != nil {
				return err
			}
		}
		rec.Line = l.N
		recs, samples = append(recs, rec), append(samples, rec.Sample)
		i++
		return nil
	})
	if err == nil && i != sf.gid.n {
		err = fmt.Errorf("%s: %d records, %d when first read: the file changed", sf.name, i, sf.gid.n)
	}
	if err == nil && len(recs) > 0 {
		err = flush()
	}
	return err
}

// writeInterleaved computes the advantages group by group in order of first appearance, reading each
// record's line at its offset (the groups are interleaved in the file), then writes every line with
// its advantage in one more sequential read.
func (sf *SamplesFile) writeInterleaved(bw *bufio.Writer, st *Stream) error {
	n, ng := sf.gid.n, len(sf.uids.names)
	start := make([]int32, ng+1)
	for i := 0; i < n; i++ {
		start[sf.gid.at(i)+1]++
	}
	for g := 0; g < ng; g++ {
		start[g+1] += start[g]
	}
	order := make([]int32, n)
	next := slices.Clone(start[:ng])
	for i := 0; i < n; i++ {
		g := sf.gid.at(i)
		order[next[g]] = int32(i)
		next[g]++
	}
	adv := make([]float64, n)
	var buf []byte
	var samples []Sample
	for g := 0; g < ng; g++ {
		members := order[start[g]:start[g+1]]
		samples = samples[:0]
		for _, i := range members {
			// The record's line runs to where the next record's starts (blank lines between are white space).
			from, to := sf.off.at(int(i)), sf.size
			if int(i)+1 < n {
				to = sf.off.at(int(i) + 1)
			}
			if cap(buf) < int(to-from) {
				buf = make([]byte, to-from)
			}
			b := buf[:to-from]
			if _, err := sf.r.ReadAt(b, from); err != nil && !(errors.Is(err, io.EOF) && to == sf.size) {
				return fmt.Errorf("read %s at byte %d: %w", sf.name, from, err)
			}
			rec, err := parseRecord(bytes.TrimSpace(b))
			if err != nil || rec.Sample.UID != sf.uids.names[g] {
				return fmt.Errorf("%s: the record at byte %d differs since it was first read: the file changed", sf.name, from)
			}
			samples = append(samples, rec.Sample)
		}
		a, err := st.Group(samples)
		if err != nil {
			return err
		}
		for k, i := range members {
			adv[i] = a[k]
		}
	}
	order, start = nil, nil
	var num []byte
	i := 0
	_, err := jsonl.Read(io.NewSectionReader(sf.r, 0, sf.size), sf.name, func(l jsonl.Line) error {
		rec, err := parseRecord(l.Text)
		if err != nil || i >= n || rec.Sample.UID != sf.uids.names[sf.gid.at(i)] {
			return sf.changed(l.N, "the line differs")
		}
		rec.Line = l.N
		num, err = writeRecord(bw, &rec, adv[i], num)
		i++
		return err
	})
	if err == nil && i != n {
		err = fmt.Errorf("%s: %d records, %d when first read: the file changed", sf.name, i, n)
	}
	return err
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
