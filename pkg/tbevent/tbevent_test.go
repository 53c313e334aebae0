package tbevent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMaskedCRC: CRC-32C of "123456789" is 0xe3069283 (the Castagnoli check value); the mask rotates
// it right by 15 and adds 0xa282ead8.
func TestMaskedCRC(t *testing.T) {
	c := uint32(0xe3069283)
	if got := crc32.Checksum([]byte("123456789"), castagnoli); got != c {
		t.Fatalf("crc32c = %#x", got)
	}
	if got, want := MaskedCRC([]byte("123456789")), ((c>>15)|(c<<17))+0xa282ead8; got != want {
		t.Fatalf("masked = %#x, want %#x", got, want)
	}
}

// TestFrame: length, its CRC, data, its CRC, little-endian.
func TestFrame(t *testing.T) {
	data := []byte("hello")
	b := Frame(nil, data)
	if len(b) != 8+4+5+4 {
		t.Fatalf("%d bytes", len(b))
	}
	if n := binary.LittleEndian.Uint64(b); n != 5 {
		t.Fatalf("length %d", n)
	}
	if got := binary.LittleEndian.Uint32(b[8:]); got != MaskedCRC(b[:8]) {
		t.Fatal("length CRC")
	}
	if !bytes.Equal(b[12:17], data) || binary.LittleEndian.Uint32(b[17:]) != MaskedCRC(data) {
		t.Fatal("data or its CRC")
	}
}

// TestScalarEventBytes holds Marshal to TensorFlow's field numbers, written out by hand: Event{wall_time
// (1, double), step (2, varint), summary (5) {value (1) {tag (1), simple_value (2, float)}}}.
func TestScalarEventBytes(t *testing.T) {
	got := Event{WallTime: 1.5, Step: 3, Summary: []Value{Scalar("a", 0.25)}}.Marshal()
	want := []byte{0x09}
	want = binary.LittleEndian.AppendUint64(want, math.Float64bits(1.5))
	want = append(want, 0x10, 3)
	value := append([]byte{0x0a, 1, 'a', 0x15}, binary.LittleEndian.AppendUint32(nil, math.Float32bits(0.25))...)
	summary := append([]byte{0x0a, byte(len(value))}, value...)
	want = append(want, 0x2a, byte(len(summary)))
	want = append(want, summary...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	head := Event{WallTime: 2, FileVersion: FileVersion}.Marshal()
	if !bytes.Contains(head, append([]byte{0x1a, byte(len(FileVersion))}, FileVersion...)) {
		t.Fatalf("file_version (3, string) missing: %x", head)
	}
}

func TestHistogram(t *testing.T) {
	h, ok := NewHistogram([]float64{-1, 0, 0.5, 1, math.NaN(), 1}, 4)
	if !ok {
		t.Fatal("no histogram")
	}
	if h.Min != -1 || h.Max != 1 || h.Num != 5 || h.Sum != 1.5 || h.SumSquares != 3.25 {
		t.Fatalf("%+v", h)
	}
	wantLimits := []float64{-1, -0.5, 0, 0.5, 1}
	wantCounts := []float64{0, 1, 1, 1, 2}
	if !equal(h.BucketLimit, wantLimits) || !equal(h.Bucket, wantCounts) {
		t.Fatalf("limits %v counts %v, want %v %v", h.BucketLimit, h.Bucket, wantLimits, wantCounts)
	}
	h, _ = NewHistogram([]float64{2, 2}, 30)
	if !equal(h.BucketLimit, []float64{2}) || !equal(h.Bucket, []float64{2}) {
		t.Fatalf("equal values: %+v", h)
	}
	if _, ok := NewHistogram([]float64{math.Inf(1)}, 3); ok {
		t.Fatal("no finite value, yet a histogram")
	}
}

// TestWriteRead writes scalars, a text and a histogram and reads them back through the framing (both
// CRCs checked) and the Event decoder.
func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1700000000, 0)
	w, err := Create(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(w.Path()), "events.out.tfevents.1700000000.") {
		t.Fatalf("name %s", w.Path())
	}
	h, _ := NewHistogram([]float64{1, 2, 3}, 2)
	if err := w.Write(1, now.Add(time.Second), Scalar("reward/mean", 0.5), Scalar("loss/pg", math.NaN())); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(2, now.Add(2*time.Second), Text("transcripts", "**a**: hi"), Histo("adv/a", h)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w2, err := Create(dir, now) // the same second: another name
	if err != nil {
		t.Fatal(err)
	}
	w2.Close()
	if w2.Path() == w.Path() || !strings.HasSuffix(w2.Path(), ".1") {
		t.Fatalf("second file %s", w2.Path())
	}

	evs, err := ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 || evs[0].FileVersion != FileVersion || evs[0].Writer != WriterName || evs[0].WallTime != 1.7e9 {
		t.Fatalf("%+v", evs)
	}
	e1, e2 := evs[1], evs[2]
	if e1.Step != 1 || e1.WallTime != 1.7e9+1 || len(e1.Summary) != 2 || e1.Summary[0].Tag != "reward/mean" ||
		e1.Summary[0].Kind != KindScalar || e1.Summary[0].Scalar != 0.5 || !math.IsNaN(float64(e1.Summary[1].Scalar)) {
		t.Fatalf("step 1: %+v", e1)
	}
	tx, hv := e2.Summary[0], e2.Summary[1]
	if e2.Step != 2 || tx.Kind != KindText || tx.Text != "**a**: hi" || tx.Plugin != TextPlugin {
		t.Fatalf("text: %+v", tx)
	}
	if hv.Kind != KindHistogram || hv.Tag != "adv/a" || hv.Histo.Num != 3 || !equal(hv.Histo.Bucket, h.Bucket) ||
		!equal(hv.Histo.BucketLimit, h.BucketLimit) || hv.Histo.SumSquares != 14 {
		t.Fatalf("histogram: %+v %+v", hv, hv.Histo)
	}

	// A flipped byte in the data fails its CRC; a cut file is torn.
	b, _ := os.ReadFile(w.Path())
	bad := append([]byte(nil), b...)
	bad[len(bad)-10] ^= 1
	os.WriteFile(w.Path(), bad, 0o644)
	if _, err := ReadFile(w.Path()); err == nil || !strings.Contains(err.Error(), "data CRC") {
		t.Fatalf("flipped byte: %v", err)
	}
	os.WriteFile(w.Path(), b[:len(b)-3], 0o644)
	if evs, err := ReadFile(w.Path()); !errors.Is(err, ErrTorn) || len(evs) != 2 {
		t.Fatalf("cut file: %d events, %v", len(evs), err)
	}
}

// TestPrune: drmas's files lose the steps after the checkpoint and a torn tail; a file left with no
// step is removed; a file drmas did not write is left alone, however many steps it holds.
func TestPrune(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1700000000, 0)
	write := func(at time.Time, steps ...int64) string {
		w, err := Create(dir, at)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range steps {
			if err := w.Write(s, at, Scalar("x", float64(s))); err != nil {
				t.Fatal(err)
			}
		}
		w.Close()
		return w.Path()
	}
	a := write(now, 1, 2, 3, 4, 5)
	b := write(now.Add(time.Hour), 6, 7)
	c := write(now.Add(2*time.Hour), 2, 3) // cut short below
	cb, _ := os.ReadFile(c)
	os.WriteFile(c, cb[:len(cb)-5], 0o644)
	// Another writer's file: the same framing, no drmas writer.
	foreign := filepath.Join(dir, FilePrefix+"0000000001.other")
	var fb []byte
	fb = Frame(fb, Event{WallTime: 1, FileVersion: FileVersion}.Marshal())
	fb = Frame(fb, Event{WallTime: 1, Step: 9, Summary: []Value{Scalar("x", 9)}}.Marshal())
	os.WriteFile(foreign, fb, 0o644)
	junk := filepath.Join(dir, FilePrefix+"junk")
	os.WriteFile(junk, []byte("not a record"), 0o644)

	changed, err := Prune(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 3 {
		t.Fatalf("changed %v", changed)
	}
	steps := func(path string) []int64 {
		evs, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, e := range evs[1:] {
			out = append(out, e.Step)
		}
		return out
	}
	if got := steps(a); !equalSteps(got, []int64{1, 2, 3}) {
		t.Fatalf("a: %v", got)
	}
	if _, err := os.Stat(b); !os.IsNotExist(err) {
		t.Fatalf("b (steps 6, 7 only) not removed: %v", err)
	}
	if got := steps(c); !equalSteps(got, []int64{2}) {
		t.Fatalf("c (torn after step 2): %v", got)
	}
	if got, _ := os.ReadFile(foreign); !bytes.Equal(got, fb) {
		t.Fatal("foreign file changed")
	}
	if got, _ := os.ReadFile(junk); string(got) != "not a record" {
		t.Fatal("junk file changed")
	}
	if changed, err := Prune(dir, 3); err != nil || len(changed) != 0 {
		t.Fatalf("second prune: %v %v", changed, err)
	}
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-12 {
			return false
		}
	}
	return true
}

func equalSteps(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
