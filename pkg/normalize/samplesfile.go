package normalize

// A samples file streamed through Advantages: indexed once, its prompt groups read back one at a
// time (drmas advantages on files larger than memory).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/drmas/drmas/pkg/jsonl"
)

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
	return sf.eachRun(func(rec Record) {
		recs, samples = append(recs, rec), append(samples, rec.Sample)
	}, func() error {
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
	})
}

// eachRun reads a file whose uids' records are consecutive once more, checking each line against
// the index: add takes each record, and end is called when a group (a run of records) has ended,
// before the next group's first record and after the last. A line that reads differently, or a
// different number of records, is an error: the file changed since it was scanned.
func (sf *SamplesFile) eachRun(add func(rec Record), end func() error) error {
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
			if err := end(); err != nil {
				return err
			}
		}
		rec.Line = l.N
		add(rec)
		i++
		return nil
	})
	if err == nil && i != sf.gid.n {
		err = fmt.Errorf("%s: %d records, %d when first read: the file changed", sf.name, i, sf.gid.n)
	}
	if err == nil && i > 0 {
		err = end()
	}
	return err
}

// writeInterleaved computes the advantages group by group in order of first appearance, reading each
// record's line at its offset (the groups are interleaved in the file), then writes every line with
// its advantage in one more sequential read.
func (sf *SamplesFile) writeInterleaved(bw *bufio.Writer, st *Stream) error {
	n, ng := sf.gid.n, len(sf.uids.names)
	start, order := sf.groupOrder()
	adv := make([]float64, n)
	var buf []byte
	var samples []Sample
	for g := 0; g < ng; g++ {
		members := order[start[g]:start[g+1]]
		var err error
		if samples, buf, err = sf.readGroup(g, members, samples[:0], buf); err != nil {
			return err
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

// groupOrder sorts the records by group (counting sort, input order within a group): group g's
// records are order[start[g]:start[g+1]].
func (sf *SamplesFile) groupOrder() (start, order []int32) {
	n, ng := sf.gid.n, len(sf.uids.names)
	start = make([]int32, ng+1)
	for i := 0; i < n; i++ {
		start[sf.gid.at(i)+1]++
	}
	for g := 0; g < ng; g++ {
		start[g+1] += start[g]
	}
	order = make([]int32, n)
	next := slices.Clone(start[:ng])
	for i := 0; i < n; i++ {
		g := sf.gid.at(i)
		order[next[g]] = int32(i)
		next[g]++
	}
	return start, order
}

// readGroup reads the samples of group g, whose records are members, each at its offset, appending
// them to samples; buf is scratch (returned grown).
func (sf *SamplesFile) readGroup(g int, members []int32, samples []Sample, buf []byte) ([]Sample, []byte, error) {
	n := sf.gid.n
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
			return samples, buf, fmt.Errorf("read %s at byte %d: %w", sf.name, from, err)
		}
		rec, err := parseRecord(bytes.TrimSpace(b))
		if err != nil || rec.Sample.UID != sf.uids.names[g] {
			return samples, buf, fmt.Errorf("%s: the record at byte %d differs since it was first read: the file changed", sf.name, from)
		}
		samples = append(samples, rec.Sample)
	}
	return samples, buf, nil
}

// EachGroup reads the file's prompt groups back one at a time, in order of each uid's first record,
// each group's samples in input order (what Stream.Group takes), and calls fn with each; the slice
// is reused after fn returns. Memory beyond the index: the largest group, and when the uids'
// records are interleaved, 4 bytes per record. The file must not change after ScanSamples.
func (sf *SamplesFile) EachGroup(fn func(samples []Sample) error) error {
	var samples []Sample
	if !sf.contiguous {
		start, order := sf.groupOrder()
		var buf []byte
		for g := range sf.uids.names {
			var err error
			if samples, buf, err = sf.readGroup(g, order[start[g]:start[g+1]], samples[:0], buf); err != nil {
				return err
			}
			if err := fn(samples); err != nil {
				return err
			}
		}
		return nil
	}
	return sf.eachRun(func(rec Record) { samples = append(samples, rec.Sample) }, func() error {
		if err := fn(samples); err != nil {
			return err
		}
		samples = samples[:0]
		return nil
	})
}
