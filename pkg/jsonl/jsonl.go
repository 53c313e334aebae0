// Package jsonl reads JSON lines files (one JSON value per line) line by line, with the line numbers
// that error messages name. Decoding a line is the caller's: each file kind has its own record shape.
package jsonl

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// Line is one non-blank line.
type Line struct {
	N    int    // 1-based line number
	Text []byte // without surrounding white space (nor, on line 1, a UTF-8 byte order mark); the caller's to keep
	// Unterminated: the input ends after this line without a newline (a line a crash cut short?).
	Unterminated bool
}

// Read calls fn with each non-blank line of r, in order, and returns the number of lines read (blank
// ones included). An error from fn stops the reading and is returned as it is; a read error comes
// back as "read NAME:LINE: error".
func Read(r io.Reader, name string, fn func(Line) error) (lines int, err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		b, readErr := br.ReadBytes('\n')
		if readErr != nil && !errors.Is(readErr, io.EOF) {
			return lines, fmt.Errorf("read %s:%d: %w", name, lines+1, readErr)
		}
		if len(b) > 0 {
			lines++
			if lines == 1 {
				b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
			}
			if b = bytes.TrimSpace(b); len(b) > 0 {
				if err := fn(Line{N: lines, Text: b, Unterminated: readErr != nil}); err != nil {
					return lines, err
				}
			}
		}
		if readErr != nil {
			return lines, nil
		}
	}
}

// ReadFile opens path and reads it as Read does, naming path in read errors.
func ReadFile(path string, fn func(Line) error) (lines int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return Read(f, path, fn)
}
