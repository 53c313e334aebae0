package jsonl

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"unicode"

	"github.com/drmas/drmas/pkg/files"
)

// Line is one non-blank line.
type Line struct {
	N    int    // 1-based line number
	Text []byte // without surrounding white space (nor, on line 1, a UTF-8 byte order mark); the caller's to keep
	// Unterminated: the input ends after this line without a newline (a line a crash cut short?).
	Unterminated bool
	// Offset is where Text starts in the input, in bytes (to read the line again from a file).
	Offset int64
}

// MaxLine bounds one line (64 MiB): a record of any file kind drmas reads is far smaller, and the
// bound keeps a wrong file (one huge line, a binary) from growing memory without end.
var MaxLine = 64 << 20

// ErrLongLine is returned (wrapped with the name and line) for a line over MaxLine bytes.
var ErrLongLine = errors.New("line too long")

// readLine reads through the next '\n' (or the end of the input), refusing lines over max bytes.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var out []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(out)+len(chunk) > max {
			return nil, ErrLongLine
		}
		out = append(out, chunk...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return out, err
		}
	}
}

// Read calls fn with each non-blank line of r, in order, and returns the number of lines read (blank
// ones included). An error from fn stops the reading and is returned as it is; a read error comes
// back as "read NAME:LINE: error".
func Read(r io.Reader, name string, fn func(Line) error) (lines int, err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var pos int64 // input offset of the line being read
	for {
		b, readErr := readLine(br, MaxLine)
		start := pos
		pos += int64(len(b))
		if errors.Is(readErr, ErrLongLine) {
			return lines, fmt.Errorf("%s:%d: %w (over %d bytes): not a JSON lines file?", name, lines+1, readErr, MaxLine)
		}
		if readErr != nil && !errors.Is(readErr, io.EOF) {
			return lines, fmt.Errorf("read %s:%d: %w", name, lines+1, readErr)
		}
		if len(b) > 0 {
			lines++
			if lines == 1 && bytes.HasPrefix(b, []byte("\xef\xbb\xbf")) {
				b, start = b[3:], start+3
			}
			start += int64(len(b) - len(bytes.TrimLeftFunc(b, unicode.IsSpace)))
			if b = bytes.TrimSpace(b); len(b) > 0 {
				if err := fn(Line{N: lines, Text: b, Unterminated: readErr != nil, Offset: start}); err != nil {
					return lines, err
				}
			}
		}
		if readErr != nil {
			return lines, nil
		}
	}
}

// ReadFile opens path (a regular file: a FIFO or a device is refused) and reads it as Read does,
// naming path in read errors.
func ReadFile(path string, fn func(Line) error) (lines int, err error) {
	f, err := files.Open(path, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return Read(f, path, fn)
}
