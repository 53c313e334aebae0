package files

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Size bounds for the kinds of files drmas reads whole.
const (
	MaxConfig = 4 << 20   // a run config or a model's config.json
	MaxJSON   = 256 << 20 // tokenizer.json, a sharded model's index (large vocabularies run to tens of MB)
)

// Open opens a regular file of at most limit bytes (limit ≤ 0: no size bound) for reading. It
// checks the path before opening it, so a FIFO is refused rather than waited on. Errors name the file.
func Open(path string, limit int64) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, named(path, err)
	}
	if err := check(path, st, limit); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, named(path, err)
	}
	// The path could have been swapped between the two calls: check what was opened.
	if st, err = f.Stat(); err != nil || check(path, st, limit) != nil {
		f.Close()
		if err == nil {
			err = check(path, st, limit)
		}
		return nil, err
	}
	return f, nil
}

// Read reads a whole regular file of at most limit bytes.
func Read(path string, limit int64) ([]byte, error) {
	f, err := Open(path, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := io.Reader(f)
	if limit > 0 {
		r = io.LimitReader(f, limit+1)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if limit > 0 && int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than the %d bytes allowed", path, limit)
	}
	return b, nil
}

func check(path string, st fs.FileInfo, limit int64) error {
	if !st.Mode().IsRegular() {
		kind := "not a plain file"
		switch m := st.Mode(); {
		case m.IsDir():
			kind = "a directory"
		case m&fs.ModeNamedPipe != 0:
			kind = "a FIFO"
		case m&fs.ModeDevice != 0:
			kind = "a device"
		case m&fs.ModeSocket != 0:
			kind = "a socket"
		}
		return fmt.Errorf("%s: not a regular file (%s)", path, kind)
	}
	if limit > 0 && st.Size() > limit {
		return fmt.Errorf("%s: %d bytes, more than the %d allowed", path, st.Size(), limit)
	}
	return nil
}

// named returns err with the path in front once (os errors already carry it as "op path: err").
func named(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", path, pe.Err)
	}
	return fmt.Errorf("%s: %w", path, err)
}
