package jsonl

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	in := "\xef\xbb\xbf{\"a\":1}\n\n  {\"b\":2}  \r\n\t\n{\"c\":"
	var got []Line
	n, err := Read(strings.NewReader(in), "x.jsonl", func(l Line) error {
		got = append(got, l)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Line{{N: 1, Text: []byte(`{"a":1}`), Offset: 3}, {N: 3, Text: []byte(`{"b":2}`), Offset: 14}, {N: 5, Text: []byte(`{"c":`), Unterminated: true, Offset: 27}}
	if n != 5 || !reflect.DeepEqual(got, want) {
		t.Errorf("lines %d, got %+v; want 5, %+v", n, got, want)
	}
	for _, l := range got { // the offsets read the lines back
		if back := in[l.Offset : l.Offset+int64(len(l.Text))]; back != string(l.Text) {
			t.Errorf("line %d at offset %d reads back %q", l.N, l.Offset, back)
		}
	}
}

func TestReadStopsAtCallerError(t *testing.T) {
	stop := errors.New("stop")
	calls := 0
	_, err := Read(strings.NewReader("1\n2\n3\n"), "x", func(l Line) error {
		calls++
		if l.N == 2 {
			return stop
		}
		return nil
	})
	if err != stop || calls != 2 {
		t.Errorf("err %v after %d calls; want stop after 2", err, calls)
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestReadError(t *testing.T) {
	_, err := Read(failing{}, "x.jsonl", func(Line) error { return nil })
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "x.jsonl:1") {
		t.Errorf("err = %v, want the read error naming x.jsonl:1", err)
	}
}

// A long line is read whole (no line-length limit of bufio.Scanner).
func TestLongLine(t *testing.T) {
	long := strings.Repeat("x", 3<<20)
	_, err := Read(strings.NewReader(long+"\nend\n"), "x", func(l Line) error {
		if l.N == 1 && len(l.Text) != len(long) {
			t.Errorf("line 1: %d bytes, want %d", len(l.Text), len(long))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestNum(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{1.5, "1.5"}, {3.3455900847911835e-05, "3.3455900847911835e-05"}, {-0.125, "-0.125"},
		{math.NaN(), "null"}, {math.Inf(1), "null"}, {math.Inf(-1), "null"}} {
		if got, _ := Num(c.v).MarshalJSON(); string(got) != c.want {
			t.Errorf("Num(%g) = %s, want %s", c.v, got, c.want)
		}
	}
	b, err := json.Marshal(struct {
		A Num `json:"a"`
	}{Num(math.NaN())})
	if err != nil || string(b) != `{"a":null}` {
		t.Errorf("in a struct: %s %v", b, err)
	}
}
