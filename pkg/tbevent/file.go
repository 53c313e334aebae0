package tbevent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/atomicfile"
)

// FilePrefix starts the name of every event file (TensorBoard reads the files whose name holds
// "tfevents").
const FilePrefix = "events.out.tfevents."

// File is an event file being written.
type File struct {
	f    *os.File
	path string
}

// Create makes dir if need be and starts a new event file in it,
// events.out.tfevents.<unix seconds>.<host> (with a .N suffix when that name is taken), whose first
// record is the file_version Event.
func Create(dir string, now time.Time) (*File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	host = strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator {
			return '_'
		}
		return r
	}, host)
	base := fmt.Sprintf("%s%010d.%s", FilePrefix, now.Unix(), host)
	for n := 0; ; n++ {
		path := filepath.Join(dir, base)
		if n > 0 {
			path += fmt.Sprintf(".%d", n)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		w := &File{f: f, path: path}
		head := Event{WallTime: wallTime(now), FileVersion: FileVersion, Writer: WriterName}
		if err := w.write(head); err != nil {
			f.Close()
			return nil, err
		}
		return w, atomicfile.SyncDir(dir)
	}
}

// Path is the file's path.
func (w *File) Path() string { return w.path }

func (w *File) dir() string { return filepath.Dir(w.path) }

// Write appends one Event of the values at step.
func (w *File) Write(step int64, wall time.Time, values ...Value) error {
	if len(values) == 0 {
		return nil
	}
	return w.write(Event{WallTime: wallTime(wall), Step: step, Summary: values})
}

func (w *File) write(e Event) error {
	_, err := w.f.Write(Frame(nil, e.Marshal()))
	return err
}

// Close flushes the file to disk and closes it.
func (w *File) Close() error {
	err := w.f.Sync()
	return errors.Join(err, w.f.Close())
}

func wallTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// ReadFile reads an event file's Events, in order. A file cut short in its last record gives the
// Events before it and ErrTorn.
func ReadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Event
	err = ReadRecords(bufio.NewReader(f), func(data []byte, _ int64) error {
		e, err := ParseEvent(data)
		if err != nil {
			return err
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
	}
	return out, err
}

// Files lists dir's event files (by name), sorted; none when dir does not exist.
func Files(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasPrefix(e.Name(), FilePrefix) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// Prune makes dir's event files hold no step after step, for a run resumed from that step's
// checkpoint: each file this package wrote (its first Event names WriterName) that holds a later step,
// or ends in a torn or damaged record, is rewritten with only its Events up to step, in place (atomically). A
// file left with its first Event alone is removed. Files others wrote are left as they are. It
// returns the files it changed.
func Prune(dir string, step int64) ([]string, error) {
	paths, err := Files(dir)
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, path := range paths {
		keep, events, dirty, ours, err := pruned(path, step)
		if err != nil {
			return changed, err
		}
		if !ours || !dirty {
			continue
		}
		if events == 0 {
			err = os.Remove(path)
		} else {
			err = atomicfile.WriteBytes(path, keep)
		}
		if err != nil {
			return changed, err
		}
		changed = append(changed, path)
	}
	if len(changed) > 0 {
		return changed, atomicfile.SyncDir(dir)
	}
	return nil, nil
}

// pruned reads an event file and returns its records up to step (the first Event included), how many
// step Events they hold, whether that drops anything, and whether the file is this package's.
func pruned(path string, step int64) (keep []byte, events int, dirty, ours bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, false, false, err
	}
	defer f.Close()
	first := true
	errNotOurs := errors.New("not ours")
	err = ReadRecords(bufio.NewReader(f), func(data []byte, _ int64) error {
		e, err := ParseEvent(data)
		if err != nil {
			return err
		}
		if first {
			first = false
			if e.FileVersion == "" || e.Writer != WriterName {
				return errNotOurs
			}
			ours = true
			keep = Frame(keep, data)
			return nil
		}
		if e.Step > step {
			dirty = true
			return nil
		}
		events++
		keep = Frame(keep, data)
		return nil
	})
	switch {
	case err != nil && !ours: // not an event file of drmas's (or not one it can read): not its own
		return nil, 0, false, false, nil
	case err != nil: // torn or damaged after its records up to here: those are kept
		return keep, events, true, true, nil
	}
	return keep, events, dirty, ours, nil
}
